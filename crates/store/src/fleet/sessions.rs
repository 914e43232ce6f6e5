//! This process's database sessions, registered in `coordinator_sessions`
//! so that newer coordinators never take them for an older coordinator's
//! (docs/operating.md "Upgrading").
//!
//! A session only reads when it connects (its id, its server, its
//! database: nothing that can wait on a lock, so a node under FLUSH TABLES
//! WITH READ LOCK or a backup's lock still hands out connections). A
//! registrar task per database and process writes what its sessions read,
//! every second, in one statement, on a short connection of its own. A
//! coordinator allows for that delay (a session counts as unregistered
//! only after a grace period).

use crate::convert_sqlx_err;
use jobfence_domain::CoordinatorError;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions, Connection, Row};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Instant;

/// Where a session is: its server (`@@hostname:@@port`, since a
/// connection id is one server's), its database, its connection id.
type Key = (String, String, u64);

/// A session of this process, by [`Key`]: the process name it registers
/// under, the registrar that writes it (its server and database as the
/// store names them: `host:port/database`), and whether its row is
/// written.
static OWN: Mutex<BTreeMap<Key, Own>> = Mutex::new(BTreeMap::new());

struct Own {
    name: String,
    registrar: String,
    written: bool,
    /// When it was remembered: a process list read before then may not
    /// show it yet.
    since: Instant,
}

fn own() -> std::sync::MutexGuard<'static, BTreeMap<Key, Own>> {
    OWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// The registrar of each database (`host:port/database`) of this process.
static REGISTRARS: Mutex<BTreeMap<String, tokio::task::JoinHandle<()>>> =
    Mutex::new(BTreeMap::new());

/// Remembers a session that just connected to `options`' database as
/// `name`'s; its row is written by the database's registrar (started here
/// when there is none, or its runtime ended).
///
/// Errors: the session failed its first statement (it is dropped).
pub(crate) async fn remember(
    conn: &mut sqlx::MySqlConnection,
    name: &str,
    options: &MySqlConnectOptions,
) -> Result<(), sqlx::Error> {
    let registrar = ensure_registrar(options);
    let row = sqlx::query(include_str!("../queries/fleet/this_session.sql"))
        .fetch_one(&mut *conn)
        .await?;
    let id = row.try_get::<i64, _>("id")?.max(0) as u64;
    let key = (crate::rows_text(&row, 1)?, crate::rows_text(&row, 2)?, id);
    tracing::debug!(node = %key.0, database = %key.1, connection_id = id, "session remembered");
    own().insert(
        key,
        Own {
            name: name.to_owned(),
            registrar,
            written: false,
            since: Instant::now(),
        },
    );
    Ok(())
}

/// Whether the session `id` of `node` is one of this process's.
pub(crate) fn is_own(node: &str, id: u64) -> bool {
    own().keys().any(|(n, _, i)| n == node && *i == id)
}

/// Forgets this process's sessions of `node` on `database` that are no
/// longer `live` (the process list a check reads shows one database's),
/// read from `read_at` on. A session remembered since then may be missing
/// from that list only because it connected after it was read: it is kept
/// (forgotten, it would never be registered, and every newer coordinator
/// would take it for an older one's for as long as it lives).
pub(crate) fn forget_closed(node: &str, database: &str, live: &BTreeSet<u64>, read_at: Instant) {
    own().retain(|(n, db, id), o| n != node || db != database || keep(*id, o.since, live, read_at));
}

/// Whether a session `id` of this process, remembered at `since`, stays
/// remembered after a process list `live` read from `read_at` on.
fn keep(id: u64, since: Instant, live: &BTreeSet<u64>, read_at: Instant) -> bool {
    live.contains(&id) || since >= read_at
}

/// Starts the registrar of `options`' database unless one runs; its key.
fn ensure_registrar(options: &MySqlConnectOptions) -> String {
    let database = options.get_database().unwrap_or_default();
    let key = format!("{}:{}/{database}", options.get_host(), options.get_port());
    let mut registrars = REGISTRARS.lock().unwrap_or_else(|p| p.into_inner());
    if registrars.get(&key).is_some_and(|t| !t.is_finished()) {
        return key;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return key;
    };
    let options = options.clone();
    let registrar = key.clone();
    let task = runtime.spawn(async move {
        let mut tick = tokio::time::interval(super::REGISTRAR_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = write_pending(&options, &registrar).await {
                tracing::debug!(error = %e, "sessions' registrations not written yet");
            }
        }
    });
    registrars.insert(key.clone(), task);
    key
}

/// Writes the rows of the sessions of `registrar` (this process's on its
/// server and database) not written yet, on a connection of its own to
/// `options`, in one statement. A schema without the table yet (error
/// 1146) keeps them for later. Returns how many it wrote.
async fn write_pending(
    options: &MySqlConnectOptions,
    registrar: &str,
) -> Result<usize, CoordinatorError> {
    let pending: Vec<(Key, String)> = own()
        .iter()
        .filter(|(_, o)| o.registrar == registrar && !o.written)
        .map(|(k, o)| (k.clone(), o.name.clone()))
        .collect();
    if pending.is_empty() {
        return Ok(0);
    }
    let sql = include_str!("../queries/fleet/register_sessions.sql").replace(
        "{rows}",
        &vec!["(?, ?, ?, UTC_TIMESTAMP(6))"; pending.len()].join(", "),
    );
    let mut q = sqlx::query(&sql);
    for ((node, _, id), name) in &pending {
        q = q.bind(node).bind(*id as i64).bind(name);
    }
    let mut conn = options.connect().await.map_err(convert_sqlx_err)?;
    let written = q.execute(&mut conn).await;
    let _ = conn.close().await;
    match written {
        Ok(_) => {}
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42S02") => return Ok(0),
        Err(e) => return Err(convert_sqlx_err(e)),
    }
    tracing::debug!(sessions = pending.len(), "sessions registered");
    let mut own = own();
    for (key, _) in &pending {
        if let Some(entry) = own.get_mut(key) {
            entry.written = true;
        }
    }
    Ok(pending.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_session_that_connected_after_the_process_list_was_read_is_kept() {
        let read_at = Instant::now();
        let live: BTreeSet<u64> = [7].into();
        let before = read_at - Duration::from_millis(5);
        let after = read_at + Duration::from_millis(5);
        assert!(keep(7, before, &live, read_at), "listed: kept");
        assert!(
            !keep(8, before, &live, read_at),
            "closed before the read: forgotten"
        );
        assert!(
            keep(9, after, &live, read_at),
            "connected after the read: kept"
        );
    }
}
