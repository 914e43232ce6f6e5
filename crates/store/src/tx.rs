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
//!
//! A transaction that ended keeps its connection warm for the next one
//! ([`Warm`]) instead of handing it back to the pool: sqlx pings every
//! connection it gets back: a round trip, and CPU on both sides, per
//! transaction. A warm connection that rested [`IDLE_CHECK`] or longer is
//! pinged before it is used instead, as the pools do with theirs: the
//! server (its `wait_timeout`) or a proxy may have closed it meanwhile,
//! and a transaction must not fail on that.

use super::errors::convert_commit_err;
use super::{convert_sqlx_err, IDLE_CHECK};
use jobfence_domain::CoordinatorError;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Executor, MySql, MySqlConnection, MySqlPool};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections of the batch pool between two transactions, still checked
/// out of the pool (so still counted against its size, and never pinged
/// on their way back), newest last. One that rested longer than
/// [`Warm::REST`] goes back to the pool instead (the pool then tests it,
/// and closes it when idle too long), so a quiet coordinator never runs a
/// transaction on a connection the server may have dropped meanwhile.
#[derive(Debug, Default)]
pub(crate) struct Warm {
    conns: Mutex<Vec<(PoolConnection<MySql>, Instant)>>,
}

impl Warm {
    /// How long a connection may rest here.
    const REST: Duration = Duration::from_secs(30);

    /// The connection that rested least, and how long it rested, if that
    /// is less than [`REST`](Self::REST); older ones go back to the pool.
    fn take(&self) -> Option<(PoolConnection<MySql>, Duration)> {
        let mut conns = self.conns.lock().expect("warm connections poisoned");
        let (conn, since) = conns.pop()?;
        let rested = since.elapsed();
        if rested < Self::REST {
            return Some((conn, rested));
        }
        // Every other one rested longer still.
        conns.clear();
        None
    }

    fn put(&self, conn: PoolConnection<MySql>) {
        let mut conns = self.conns.lock().expect("warm connections poisoned");
        conns.push((conn, Instant::now()));
    }
}

/// An open transaction of the batch pool.
#[derive(Debug)]
pub(crate) struct Tx {
    conn: Option<PoolConnection<MySql>>,
    open: bool,
    warm: Arc<Warm>,
}

impl Tx {
    /// Takes a connection (a warm one first: pinged when it rested
    /// [`IDLE_CHECK`] or longer, and closed if the ping fails); the
    /// transaction begins with the first statement run on it.
    pub async fn start(pool: &MySqlPool, warm: &Arc<Warm>) -> Result<Tx, CoordinatorError> {
        let conn = match warm.take() {
            Some((conn, rested)) if rested < IDLE_CHECK => Some(conn),
            // Bounded like the pool's own check (by its acquire timeout): a
            // connection whose peer vanished without a word (a node powered
            // off, a proxy that forgot it) would otherwise hold the call
            // until TCP gives up.
            Some((mut conn, _)) => {
                let limit = pool.options().get_acquire_timeout();
                match tokio::time::timeout(limit, conn.ping()).await {
                    Ok(Ok(())) => Some(conn),
                    failed => {
                        let why = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => format!("no answer to a ping within {limit:?}"),
                        };
                        tracing::debug!(why, "a warm connection died while it rested");
                        conn.close_on_drop();
                        None
                    }
                }
            }
            None => None,
        };
        let conn = match conn {
            Some(conn) => conn,
            None => pool.acquire().await.map_err(convert_sqlx_err)?,
        };
        Ok(Tx {
            conn: Some(conn),
            open: true,
            warm: warm.clone(),
        })
    }

    fn conn(&mut self) -> &mut MySqlConnection {
        self.conn.as_mut().expect("a transaction's connection")
    }

    /// Commits. A deadlock or lock wait timeout at COMMIT (Galera's
    /// certification failure) is a `TransactionConflict`: rolled back. Any
    /// other failure leaves the outcome unknown (docs/design.md rule 4):
    /// `CommitOutcomeUnknown`, and the connection is closed.
    pub async fn commit(&mut self) -> Result<(), CoordinatorError> {
        let done = self.conn().execute("COMMIT").await;
        self.end(done.is_ok());
        done.map(|_| ()).map_err(convert_commit_err)
    }

    /// After a COMMIT or ROLLBACK: the transaction is over when it
    /// succeeded; when it failed, the connection is closed (its state is
    /// unknown) and nothing more runs on this `Tx`.
    fn end(&mut self, succeeded: bool) {
        if !succeeded {
            if let Some(mut conn) = self.conn.take() {
                conn.close_on_drop();
            }
        }
        self.open = false;
    }

    /// Runs `statements` (text, no placeholders: see `literal`) and COMMIT
    /// in one round trip. The server refusing a statement is its own error
    /// (it runs nothing after it; the transaction is abandoned). A failure
    /// of COMMIT, or of the connection at any point (COMMIT may have run),
    /// is as for [`commit`](Self::commit).
    pub async fn commit_after<S: AsRef<str>>(
        &mut self,
        statements: &[S],
    ) -> Result<(), CoordinatorError> {
        let done = self.send_with_commit(statements).await;
        self.end(done.is_ok());
        done
    }

    async fn send_with_commit<S: AsRef<str>>(
        &mut self,
        statements: &[S],
    ) -> Result<(), CoordinatorError> {
        use tokio_stream::StreamExt;
        let mut text = String::new();
        for s in statements {
            text.push_str(s.as_ref());
            text.push_str(";\n");
        }
        text.push_str("COMMIT");
        let mut results = sqlx::raw_sql(&text).execute_many(self.conn());
        for _ in statements {
            match results.next().await {
                Some(Ok(_)) => {}
                // The server refused the statement: it ran nothing after
                // it, so COMMIT never ran.
                Some(Err(e @ sqlx::Error::Database(_))) => return Err(convert_sqlx_err(e)),
                // The connection failed with COMMIT sent or on its way:
                // the server may have run everything (docs/design.md rule 4).
                Some(Err(e)) => return Err(CoordinatorError::CommitOutcomeUnknown(e.to_string())),
                None => {
                    return Err(CoordinatorError::Internal(
                        "no result for a statement before COMMIT".into(),
                    ))
                }
            }
        }
        match results.next().await {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(convert_commit_err(e)),
            None => {
                return Err(CoordinatorError::CommitOutcomeUnknown(
                    "no answer to COMMIT".into(),
                ))
            }
        }
        // Read to the end of the stream: a multi-statement query left half
        // read leaves the connection waiting for results, and the pool's
        // check on release would wait forever.
        while let Some(rest) = results.next().await {
            rest.map_err(convert_commit_err)?;
        }
        drop(results);
        Ok(())
    }

    /// Whether a transaction may be open on the connection: from the start
    /// until a COMMIT or ROLLBACK succeeded, and again from the next
    /// statement run on it (autocommit is off: any statement begins one).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Marks the transaction as ended by a COMMIT that the caller ran
    /// itself (within a multi-statement query) and saw succeed.
    pub fn committed(&mut self) {
        self.open = false;
    }

    /// Rolls back (nothing of the transaction was applied).
    pub async fn rollback(&mut self) -> Result<(), CoordinatorError> {
        let done = self.conn().execute("ROLLBACK").await;
        self.end(done.is_ok());
        done.map(|_| ()).map_err(convert_sqlx_err)
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if self.open {
            conn.close_on_drop();
        } else {
            self.warm.put(conn);
        }
    }
}

impl Deref for Tx {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        self.conn.as_ref().expect("a transaction's connection")
    }
}

impl DerefMut for Tx {
    /// A statement run on the connection begins a transaction (autocommit
    /// is off), even after a COMMIT: the transaction is open again.
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        self.open = true;
        self.conn()
    }
}
