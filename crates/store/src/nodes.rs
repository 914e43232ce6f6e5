//! One database reached through several nodes: the nodes of a Galera
//! cluster, given in order of preference (`--database-url` with several
//! URLs). The store talks to one node at a time, the first of the list that
//! is ready; the health probe (`health.rs`) moves it when that node stops
//! answering or leaves the primary component, and back to a node earlier
//! in the list once it is synced again, so coordinators given the same list
//! all write through the same node (the single-writer topology of
//! docs/database.md) except for the moments of a switch, when certification
//! keeps the fence.
//!
//! Why a list in the coordinator rather than a load balancer in front of
//! the nodes: a TCP load balancer cannot see that a node is alive but
//! outside the primary component (it still accepts connections, and answers
//! every query with error 1047) unless it runs a Galera-aware check script;
//! the coordinator asks the node itself (`wsrep_ready`) at every health
//! check. A load-balanced address works too, as a list of one.

use super::errors::convert_sqlx_err;
use super::rows_text;
use jobfence_domain::CoordinatorError;
use sqlx::{Executor, MySqlConnection};

/// Sets the session's `wsrep_sync_wait` on a Galera node (`wsrep_on` is
/// ON); does nothing on any other server, so the same code runs on MySQL,
/// which has no `wsrep_*` variables. `SHOW VARIABLES` rather than
/// `@@wsrep_on`: a variable the server lacks is an empty answer there, not
/// an error.
pub(crate) async fn galera_session(
    conn: &mut MySqlConnection,
    sync_wait: u8,
) -> Result<(), sqlx::Error> {
    if !is_galera(conn).await? {
        return Ok(());
    }
    conn.execute(sqlx::raw_sql(&format!(
        "SET SESSION wsrep_sync_wait = {sync_wait}"
    )))
    .await?;
    Ok(())
}

async fn is_galera(conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
    let row = conn
        .fetch_optional(sqlx::raw_sql("SHOW VARIABLES LIKE 'wsrep_on'"))
        .await?;
    Ok(match row {
        Some(row) => rows_text(&row, 1)?.eq_ignore_ascii_case("ON"),
        None => false,
    })
}

/// Where a Galera node stands, from its own status variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeState {
    /// `wsrep_ready`: the node accepts queries (it is in the primary
    /// component). Off, every query on a table fails with error 1047.
    pub ready: bool,
    /// `wsrep_local_state_comment` is `Synced`: the node has applied
    /// everything and is no donor or joiner; only such a node is moved
    /// back to.
    pub synced: bool,
    /// `wsrep_cluster_status` (`Primary`, `non-Primary`, `Disconnected`).
    pub cluster_status: String,
}

/// The Galera state of the node `conn` is on (call only when `wsrep_on`).
pub(crate) async fn node_state(conn: &mut MySqlConnection) -> Result<NodeState, CoordinatorError> {
    let rows = conn
        .fetch_all(sqlx::raw_sql(
            "SHOW GLOBAL STATUS WHERE Variable_name IN \
             ('wsrep_ready', 'wsrep_local_state_comment', 'wsrep_cluster_status')",
        ))
        .await
        .map_err(convert_sqlx_err)?;
    let mut state = NodeState {
        ready: false,
        synced: false,
        cluster_status: String::new(),
    };
    for row in rows {
        let name = rows_text(&row, 0).map_err(convert_sqlx_err)?;
        let value = rows_text(&row, 1).map_err(convert_sqlx_err)?;
        match name.to_ascii_lowercase().as_str() {
            "wsrep_ready" => state.ready = value.eq_ignore_ascii_case("ON"),
            "wsrep_local_state_comment" => state.synced = value == "Synced",
            "wsrep_cluster_status" => state.cluster_status = value,
            _ => {}
        }
    }
    Ok(state)
}
