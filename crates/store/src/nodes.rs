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
use super::{rows_text, JobStore};
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
    let sql = include_str!("queries/server/galera_sync_wait.sql")
        .replace("{sync_wait}", &sync_wait.to_string());
    conn.execute(sqlx::raw_sql(&sql)).await?;
    Ok(())
}

async fn is_galera(conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
    let row = conn
        .fetch_optional(sqlx::raw_sql(include_str!("queries/server/galera_on.sql")))
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
        .fetch_all(sqlx::raw_sql(include_str!(
            "queries/server/galera_node_state.sql"
        )))
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

/// How long [`JobStore::outage_or_conflict`] waits for the node's answer
/// before it takes the silence for an outage.
const NODE_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl JobStore {
    /// Tells a transaction conflict from a Galera node that has left the
    /// primary component: `Ok(why)` (a conflict: run again, or report it)
    /// or `Err(DatabaseUnavailable)`.
    ///
    /// Outside the primary component a node's causal read
    /// (`wsrep_sync_wait`) fails with the lock wait timeout, 1205, within
    /// a fraction of a second, which alone cannot be told from a row lock
    /// waited on too long; the node's own status can (`wsrep_ready`,
    /// `wsrep_cluster_status`, readable outside the primary component).
    /// Running the transaction again would only fail the same way, and
    /// ABORTED would tell the caller that another writer won, so it is
    /// reported UNAVAILABLE / DATABASE_UNAVAILABLE, as docs/database.md
    /// promises.
    ///
    /// Galera is what `wsrep_on` says (asked once per store, remembered),
    /// never the status variables alone: a MariaDB built with wsrep
    /// support (Debian's) reports `wsrep_ready=OFF` and a `Disconnected`
    /// cluster status with `wsrep_on=OFF`, and there a conflict is a
    /// conflict, run again and counted.
    pub(crate) async fn outage_or_conflict(&self, why: String) -> Result<String, CoordinatorError> {
        if self.galera.get() == Some(&false) {
            return Ok(why);
        }
        let checked = tokio::time::timeout(NODE_CHECK_TIMEOUT, self.galera_node_state()).await;
        let state = match checked {
            Ok(Ok(Some(state))) => state,
            // Not Galera: the conflict stands.
            Ok(Ok(None)) => return Ok(why),
            Ok(Err(e @ CoordinatorError::DatabaseUnavailable(_))) => return Err(e),
            // The check itself failed otherwise: the conflict stands.
            Ok(Err(_)) => return Ok(why),
            Err(_) => {
                return Err(CoordinatorError::DatabaseUnavailable(format!(
                    "after a conflict ({why}), the node's state not read within {}",
                    humantime::format_duration(NODE_CHECK_TIMEOUT)
                )))
            }
        };
        if !state.ready || !state.cluster_status.eq_ignore_ascii_case("Primary") {
            return Err(CoordinatorError::DatabaseUnavailable(format!(
                "Galera node outside the primary component (wsrep_ready={}, cluster status {}): {why}",
                if state.ready { "ON" } else { "OFF" },
                state.cluster_status
            )));
        }
        Ok(why)
    }

    /// The state of the node this store talks to when the database is a
    /// Galera cluster (`wsrep_on`, asked once and remembered); `None` on
    /// any other server, whose status is then not read at all.
    async fn galera_node_state(&self) -> Result<Option<NodeState>, CoordinatorError> {
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        let galera = match self.galera.get() {
            Some(&galera) => galera,
            None => {
                let galera = is_galera(&mut conn).await.map_err(convert_sqlx_err)?;
                let _ = self.galera.set(galera);
                galera
            }
        };
        if !galera {
            return Ok(None);
        }
        node_state(&mut conn).await.map(Some)
    }

    /// `read`, unless it failed as a conflict on a Galera node outside the
    /// primary component: then `DatabaseUnavailable` (see
    /// [`outage_or_conflict`](Self::outage_or_conflict)). For the reads that
    /// are not run again on a conflict (a causal read fails with 1205 there
    /// too).
    pub(crate) async fn outage_named<T>(
        &self,
        read: Result<T, CoordinatorError>,
    ) -> Result<T, CoordinatorError> {
        match read {
            Err(CoordinatorError::TransactionConflict(why)) => Err(
                CoordinatorError::TransactionConflict(self.outage_or_conflict(why).await?),
            ),
            other => other,
        }
    }
}
