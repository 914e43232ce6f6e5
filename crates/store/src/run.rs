//! The one way the store runs a transaction or a read: [`transaction!`]
//! (the main pool), [`batch_transaction!`] (the batch pool, see `tx.rs`)
//! and [`read!`].
//!
//! Each opens what it runs on, runs the body, ends the transaction (commit
//! when the body answers, rollback when it fails), translates the error
//! once ([`Failure`] into [`CoordinatorError`]) and runs the body again on
//! a transaction conflict, with the counted policy of
//! [`JobStore::after_try`]: a deadlock, a lock wait timeout or a Galera
//! certification failure rolled everything back, so running it again
//! cannot apply anything twice. A body may run several times; it must not
//! change anything outside its transaction before it answers.
//!
//! They are macros, in the spirit of quickwit's `run_with_tx!`, rather
//! than functions taking async closures: a body's future borrows the
//! transaction, and a closure over it would have to be generic over that
//! borrow, which today's compiler cannot prove `Send` for the tasks the
//! coordinator spawns.

use super::errors::convert_sqlx_err;
use super::tx::Tx;
use super::{commit, JobStore, CONFLICT_RETRIES};
use jobfence_domain::CoordinatorError;
use sqlx::mysql::{MySqlArguments, MySqlRow};
use sqlx::{MySql, Transaction};
use std::ops::ControlFlow;

/// How a transaction's body failed, translated into a [`CoordinatorError`]
/// once, by the runner. `?` turns a `sqlx::Error` or a
/// [`CoordinatorError`] into one, so a body needs no `map_err`.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A statement failed (see `convert_sqlx_err`); rolled back.
    Sql(sqlx::Error),
    /// Anything else; rolled back.
    Error(CoordinatorError),
    /// A refusal whose event the body wrote (docs/design.md rule 7: a
    /// refused write is kept in the log): the transaction is committed,
    /// then the refusal answered. A failed commit is logged and the
    /// refusal answered all the same.
    Refused(CoordinatorError),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Failure::Sql(e)
    }
}

impl From<CoordinatorError> for Failure {
    fn from(e: CoordinatorError) -> Self {
        Failure::Error(e)
    }
}

impl From<Failure> for CoordinatorError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Sql(e) => convert_sqlx_err(e),
            Failure::Error(e) | Failure::Refused(e) => e,
        }
    }
}

/// What a transaction's body answers.
pub(crate) type Body<T> = Result<T, Failure>;

/// The loop behind [`transaction!`] and [`batch_transaction!`]: begins
/// with `store.$begin()`, binds the body's `$tx` (of type `$ty`) to it,
/// ends it with `store.$end(…)` and asks [`JobStore::after_try`] whether
/// to run it again.
macro_rules! run_transaction {
    ($store:expr, $begin:ident, $end:ident, |$tx:ident: $ty:ty| $body:expr) => {{
        let store: &$crate::JobStore = $store;
        let mut tries = 0;
        loop {
            let done = match store.$begin().await {
                Ok(mut owned) => {
                    let $tx: $ty = &mut owned;
                    let answer: $crate::run::Body<_> = $body.await;
                    store.$end(owned, answer).await
                }
                Err(e) => Err(e),
            };
            if let std::ops::ControlFlow::Break(answer) = store.after_try(done, &mut tries).await {
                break answer;
            }
        }
    }};
}
pub(crate) use run_transaction;

/// `transaction!(store, |tx| body)`: runs `body`, a future answering
/// [`Body<T>`] with `tx: &mut MySqlConnection` in scope, in a transaction
/// of `store`'s main pool; answers `Result<T, CoordinatorError>`. Commits
/// when the body answers `Ok` (a failed COMMIT is `CommitOutcomeUnknown`,
/// or a conflict when the server says it rolled back), rolls back on
/// [`Failure::Sql`] or [`Failure::Error`], commits and answers the refusal
/// on [`Failure::Refused`]; runs again on a conflict.
macro_rules! transaction {
    ($store:expr, |$tx:ident| $body:expr) => {
        $crate::run::run_transaction!(
            $store,
            begin,
            end_transaction,
            |$tx: &mut sqlx::MySqlConnection| $body
        )
    };
}
pub(crate) use transaction;

/// `batch_transaction!(store, |tx| body)`: as [`transaction!`], with
/// `tx: &mut Tx`, a transaction of the batch pool (`tx.rs`: begun by its
/// first statement). The body may end the transaction itself
/// ([`Tx::commit_after`] sends statements with the COMMIT); otherwise it
/// is committed when the body answers `Ok`. A body that fails leaves it to
/// be dropped: its connection is closed and the server rolls it back.
macro_rules! batch_transaction {
    ($store:expr, |$tx:ident| $body:expr) => {
        $crate::run::run_transaction!(
            $store,
            begin_batch,
            end_batch,
            |$tx: &mut $crate::tx::Tx| $body
        )
    };
}
pub(crate) use batch_transaction;

/// `read!(store, |conn| body)`: runs `body`, a future answering
/// [`Body<T>`] with `conn: &mut MySqlConnection` in scope, on a connection
/// of `store`'s main pool, each statement its own transaction; answers
/// `Result<T, CoordinatorError>`. Not run again on a conflict; a conflict
/// on a Galera node outside the primary component is
/// `DatabaseUnavailable` (see `outage_named`).
macro_rules! read {
    ($store:expr, |$conn:ident| $body:expr) => {{
        let store: &$crate::JobStore = $store;
        let answer = match store.pool().acquire().await {
            Ok(mut owned) => {
                let $conn: &mut sqlx::MySqlConnection = &mut *owned;
                let answer: $crate::run::Body<_> = $body.await;
                answer.map_err(jobfence_domain::CoordinatorError::from)
            }
            Err(e) => Err($crate::convert_sqlx_err(e)),
        };
        store.outage_named(answer).await
    }};
}
pub(crate) use read;

impl JobStore {
    /// The rows of one statement run on the main pool, its own
    /// transaction: [`read!`] for a read of one statement. A conflict on a
    /// Galera node outside the primary component is `DatabaseUnavailable`.
    pub(crate) async fn fetch_rows(
        &self,
        query: sqlx::query::Query<'_, MySql, MySqlArguments>,
    ) -> Result<Vec<MySqlRow>, CoordinatorError> {
        let found = query
            .fetch_all(&self.pool())
            .await
            .map_err(convert_sqlx_err);
        self.outage_named(found).await
    }

    /// Ends a transaction of the main pool as [`transaction!`] says.
    pub(crate) async fn end_transaction<T>(
        &self,
        tx: Transaction<'static, MySql>,
        answer: Body<T>,
    ) -> Result<T, CoordinatorError> {
        match answer {
            Ok(answer) => {
                commit(tx).await?;
                Ok(answer)
            }
            Err(Failure::Refused(refusal)) => {
                if let Err(e) = commit(tx).await {
                    tracing::warn!(error = %e, refusal = %refusal, "could not log a refused write");
                }
                Err(refusal)
            }
            // Dropped: rolled back.
            Err(failed) => Err(failed.into()),
        }
    }

    /// Ends a transaction of the batch pool as [`batch_transaction!`] says.
    pub(crate) async fn end_batch<T>(
        &self,
        mut tx: Tx,
        answer: Body<T>,
    ) -> Result<T, CoordinatorError> {
        match answer {
            Ok(answer) => {
                if tx.is_open() {
                    tx.commit().await?;
                }
                Ok(answer)
            }
            // A transaction a failed COMMIT ended has nothing to commit.
            Err(Failure::Refused(refusal)) if !tx.is_open() => Err(refusal),
            Err(Failure::Refused(refusal)) => {
                if let Err(e) = tx.commit().await {
                    tracing::warn!(error = %e, refusal = %refusal, "could not log a refused write");
                }
                Err(refusal)
            }
            // Dropped: its connection closed, rolled back.
            Err(failed) => Err(failed.into()),
        }
    }

    /// The conflict policy, after one try answered `done`: `Continue` to
    /// run it again after a transaction conflict (deadlock, lock wait
    /// timeout, Galera certification failure: the server rolled
    /// everything back, so running it again cannot apply anything twice),
    /// at most [`CONFLICT_RETRIES`] times, counting each conflict
    /// (`jobfence_transaction_conflicts_total`); `Break` with the answer
    /// otherwise. A conflict on a Galera node outside the primary
    /// component is `DatabaseUnavailable`.
    pub(crate) async fn after_try<T>(
        &self,
        done: Result<T, CoordinatorError>,
        tries: &mut u32,
    ) -> ControlFlow<Result<T, CoordinatorError>> {
        let why = match done {
            Err(CoordinatorError::TransactionConflict(why)) => why,
            other => return ControlFlow::Break(other),
        };
        let why = match self.outage_or_conflict(why).await {
            Ok(why) => why,
            Err(e) => return ControlFlow::Break(Err(e)),
        };
        if *tries == CONFLICT_RETRIES {
            self.count_conflict(false);
            return ControlFlow::Break(Err(CoordinatorError::TransactionConflict(why)));
        }
        *tries += 1;
        self.count_conflict(true);
        tracing::debug!(tries = *tries, why, "transaction conflict, running again");
        ControlFlow::Continue(())
    }

    /// Runs `op`, statements outside a transaction (each its own), again
    /// after a conflict, with the policy of [`after_try`](Self::after_try).
    pub(crate) async fn retry_conflicts<T, F, Fut>(&self, mut op: F) -> Result<T, CoordinatorError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, CoordinatorError>>,
    {
        let mut tries = 0;
        loop {
            if let ControlFlow::Break(answer) = self.after_try(op().await, &mut tries).await {
                return answer;
            }
        }
    }
}
