//! A transaction on a session whose autocommit is off (the batch pool):
//! the first statement starts it, so it costs no `BEGIN` round trip, and
//! `COMMIT` or `ROLLBACK` ends it.
//!
//! The one danger of such sessions is a connection going back to the pool
//! in the middle of a transaction (the next user would continue it, with
//! its locks). [`Tx`] rules that out: a transaction dropped without
//! [`commit`](Tx::commit) or [`rollback`](Tx::rollback) — an error returned
//! with `?`, a panic, a cancelled call — closes its connection instead of
//! returning it, and the server rolls the transaction back.

use super::convert_sqlx_err;
use super::errors::convert_commit_err;
use crate::domain::CoordinatorError;
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql, MySqlConnection, MySqlPool};
use std::ops::{Deref, DerefMut};

/// An open transaction of the batch pool.
#[derive(Debug)]
pub(crate) struct Tx {
    conn: PoolConnection<MySql>,
    open: bool,
}

impl Tx {
    /// Takes a connection; the transaction begins with the first statement
    /// run on it.
    pub async fn start(pool: &MySqlPool) -> Result<Tx, CoordinatorError> {
        let conn = pool.acquire().await.map_err(convert_sqlx_err)?;
        Ok(Tx { conn, open: true })
    }

    /// Commits. A deadlock or lock wait timeout at COMMIT (Galera's
    /// certification failure) is a `TransactionConflict`: rolled back. Any
    /// other failure leaves the outcome unknown (DESIGN.md rule 4):
    /// `CommitOutcomeUnknown`, and the connection is closed.
    pub async fn commit(mut self) -> Result<(), CoordinatorError> {
        let done = self.conn.execute("COMMIT").await;
        if done.is_ok() {
            self.open = false;
        }
        done.map(|_| ()).map_err(convert_commit_err)
    }

    /// Rolls back (nothing of the transaction was applied).
    pub async fn rollback(mut self) -> Result<(), CoordinatorError> {
        let done = self.conn.execute("ROLLBACK").await;
        if done.is_ok() {
            self.open = false;
        }
        done.map(|_| ()).map_err(convert_sqlx_err)
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

impl Deref for Tx {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        &self.conn
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }
}
