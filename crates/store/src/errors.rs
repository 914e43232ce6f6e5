//! sqlx errors translated once, into the coordinator's error type.

use jobfence_domain::CoordinatorError;
use sqlx::mysql::MySqlDatabaseError;

/// MySQL/MariaDB error numbers we act on.
pub(crate) mod code {
    pub const DUPLICATE_ENTRY: u16 = 1062;
    pub const LOCK_WAIT_TIMEOUT: u16 = 1205;
    pub const DEADLOCK: u16 = 1213;
    pub const TOO_MANY_CONNECTIONS: u16 = 1040;
    pub const SERVER_SHUTDOWN: u16 = 1053;
    pub const CONNECTION_KILLED: u16 = 1927;
    pub const QUERY_INTERRUPTED: u16 = 1317;
    /// `--read-only` server (a replica, or a primary being failed over).
    pub const READ_ONLY: u16 = 1290;
    /// A write in a READ ONLY transaction (MySQL, during failover).
    pub const READ_ONLY_TRANSACTION: u16 = 1792;
    /// Galera: the node is not ready (not in the primary component).
    pub const WSREP_NOT_READY: u16 = 1047;
    /// ER_ERROR_DURING_COMMIT. Galera answers it to a statement that needs
    /// to replicate while the node is losing the primary component ("Not
    /// connected to Primary Component").
    pub const ERROR_DURING_COMMIT: u16 = 1180;
    /// ER_UNKNOWN_STMT_HANDLER: EXECUTE of a statement this session has
    /// not prepared.
    pub const UNKNOWN_STMT_HANDLER: u16 = 1243;
}

/// The server's error number, if `err` is a server error.
pub(crate) fn error_number(err: &sqlx::Error) -> Option<u16> {
    match err {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|e| e.number()),
        _ => None,
    }
}

/// True if `err` is a unique-key violation of a key other than the
/// primary key (an operation key, an observation key: a row that already
/// exists). See [`is_id_collision`] for the primary key.
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    error_number(err) == Some(code::DUPLICATE_ENTRY) && !is_id_collision(err)
}

/// `err` as a statement's caller answers it when a unique-key violation
/// means another transaction inserted the row since this one looked (a
/// settlement line, an exception): a conflict, run again by the
/// transaction runner and counted, which then finds the row; anything
/// else as [`convert_sqlx_err`].
pub(crate) fn conflict_if_unique(err: sqlx::Error) -> CoordinatorError {
    if is_unique_violation(&err) {
        CoordinatorError::TransactionConflict(err.to_string())
    } else {
        convert_sqlx_err(err)
    }
}

/// True if `err` is a duplicate primary key. jobfence never writes an id
/// itself (every id is AUTO_INCREMENT), so this is an id the server picked
/// that another transaction took first: on Galera with several writer
/// nodes whose AUTO_INCREMENT steps alike, a write set replicated from
/// another node inserted it. Nothing of this transaction committed;
/// running it again picks a fresh id, so it is a conflict like a deadlock.
/// MariaDB names the key `'PRIMARY'`, MySQL 8 `'table.PRIMARY'`.
pub(crate) fn is_id_collision(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) if error_number(err) == Some(code::DUPLICATE_ENTRY) => {
            db.message().ends_with("PRIMARY'")
        }
        _ => false,
    }
}

/// Translates an error from a statement that ran before COMMIT: whatever
/// happened, the transaction did not commit.
///
/// Deadlock (1213), lock wait timeout (1205) and an id taken by another
/// transaction (1062 on a primary key, see [`is_id_collision`]) become
/// `TransactionConflict` (retryable); a lost or refused connection, and a Galera node outside the
/// primary component (1047, or 1180 while it is leaving it), become
/// `DatabaseUnavailable`; anything else is `Internal`. Every statement of
/// ours that writes runs inside a transaction, so none of these errors can
/// come from a statement that committed by itself.
pub fn convert_sqlx_err(err: sqlx::Error) -> CoordinatorError {
    if is_id_collision(&err) {
        return CoordinatorError::TransactionConflict(err.to_string());
    }
    match error_number(&err) {
        Some(code::DEADLOCK | code::LOCK_WAIT_TIMEOUT) => {
            return CoordinatorError::TransactionConflict(err.to_string())
        }
        Some(
            code::TOO_MANY_CONNECTIONS
            | code::SERVER_SHUTDOWN
            | code::CONNECTION_KILLED
            | code::QUERY_INTERRUPTED
            | code::READ_ONLY
            | code::READ_ONLY_TRANSACTION
            | code::WSREP_NOT_READY
            | code::ERROR_DURING_COMMIT,
        ) => return CoordinatorError::DatabaseUnavailable(err.to_string()),
        _ => {}
    }
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => CoordinatorError::DatabaseUnavailable(err.to_string()),
        other => CoordinatorError::Internal(other.to_string()),
    }
}

/// Translates an error from COMMIT itself (docs/design.md rule 4). A deadlock or
/// lock wait timeout (Galera reports certification failures as 1213) means
/// the server rolled back: `TransactionConflict`. Anything else — the
/// connection lost, killed, or the server shutting down while COMMIT was
/// in flight, a Galera node that lost the primary component during COMMIT
/// (1047, 1180: its write set may have reached the other nodes) — leaves
/// the outcome unknown.
pub(crate) fn convert_commit_err(err: sqlx::Error) -> CoordinatorError {
    // From a statement sent with COMMIT in one round trip, before it: the
    // server stopped there, and COMMIT never ran.
    if is_id_collision(&err) {
        return CoordinatorError::TransactionConflict(err.to_string());
    }
    match error_number(&err) {
        Some(code::DEADLOCK | code::LOCK_WAIT_TIMEOUT) => {
            CoordinatorError::TransactionConflict(err.to_string())
        }
        _ => CoordinatorError::CommitOutcomeUnknown(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_commit_is_unknown_and_only_a_deadlock_is_a_conflict() {
        let io = || sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(
            convert_commit_err(io()),
            CoordinatorError::CommitOutcomeUnknown(_)
        ));
        assert!(matches!(
            convert_commit_err(sqlx::Error::PoolClosed),
            CoordinatorError::CommitOutcomeUnknown(_)
        ));
        assert!(matches!(
            convert_sqlx_err(io()),
            CoordinatorError::DatabaseUnavailable(_)
        ));
    }
}
