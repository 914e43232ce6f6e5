//! Settlement's exceptions and their life: raised (opened, or opened
//! again) by a report, moved by a person (acknowledged, resolved) with a
//! recorded note, and resolved by a later report that no longer raises
//! them. Every step is recorded in `settlement_exception_actions`.

use crate::rows::{get, opt_text, text};
use crate::run::{transaction, Body};
use crate::{convert_sqlx_err, JobStore};
use jobfence_domain::settlement::records::{ActOnException, ExceptionAction, SettlementException};
use jobfence_domain::settlement::{ExceptionKind, ExceptionState, OPERATOR};
use jobfence_domain::CoordinatorError;
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;

/// What a report's decision raises for one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raised {
    pub kind: ExceptionKind,
    pub job_id: Option<u64>,
    pub detail: String,
}

/// What raising did: exceptions opened (or opened again), and those of the
/// subject the report resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Raising {
    pub opened: u64,
    pub resolved: u64,
}

async fn action(
    conn: &mut MySqlConnection,
    id: u64,
    what: &str,
    operator: &str,
    note: &str,
) -> Result<(), CoordinatorError> {
    sqlx::query(include_str!("../queries/settlement/exception_action.sql"))
        .bind(id)
        .bind(what)
        .bind(operator)
        .bind(note)
        .execute(conn)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(())
}

fn exception_row(row: &MySqlRow) -> Result<SettlementException, CoordinatorError> {
    let parse = |e: jobfence_domain::UnknownValue| CoordinatorError::Internal(e.to_string());
    let kind: ExceptionKind = text(row, "kind")?.parse().map_err(parse)?;
    Ok(SettlementException {
        id: get(row, "id")?,
        provider: text(row, "provider")?,
        kind,
        severity: kind.severity(),
        subject: text(row, "subject")?,
        job_id: get(row, "job_id")?,
        detail: text(row, "detail")?,
        state: text(row, "state")?.parse().map_err(parse)?,
        opened_at: get(row, "opened_at")?,
        updated_at: get(row, "updated_at")?,
        actions: Vec::new(),
    })
}

impl JobStore {
    /// Records what a report decided about `subject` (an operation key, or
    /// a keyless refund's reference): each exception in `raised` is opened
    /// (or opened again if it had been resolved; an open or acknowledged
    /// one only gets the new detail), and every other unresolved exception
    /// of the subject — one kind in `clearable`, which the report checks —
    /// is resolved under the operator name `settlement`. One short
    /// transaction, run again on a conflict.
    pub async fn raise_settlement_exceptions(
        &self,
        provider: &str,
        subject: &str,
        raised: &[Raised],
        clearable: &[ExceptionKind],
    ) -> Result<Raising, CoordinatorError> {
        transaction!(self, |tx| self
            .raise_in(tx, provider, subject, raised, clearable))
    }

    async fn raise_in(
        &self,
        tx: &mut MySqlConnection,
        provider: &str,
        subject: &str,
        raised: &[Raised],
        clearable: &[ExceptionKind],
    ) -> Body<Raising> {
        let mut done = Raising::default();
        let held = sqlx::query(include_str!(
            "../queries/settlement/exceptions_of_subject.sql"
        ))
        .bind(provider)
        .bind(subject)
        .fetch_all(&mut *tx)
        .await?;
        for row in &held {
            let kind: ExceptionKind =
                text(row, "kind")?
                    .parse()
                    .map_err(|e: jobfence_domain::UnknownValue| {
                        CoordinatorError::Internal(e.to_string())
                    })?;
            if clearable.contains(&kind) && !raised.iter().any(|r| r.kind == kind) {
                let id: u64 = get(row, "id")?;
                let state = text(row, "state")?;
                set_state(tx, id, &state, ExceptionState::Resolved).await?;
                action(
                    tx,
                    id,
                    "resolved",
                    OPERATOR,
                    "a later report no longer contradicts the job",
                )
                .await?;
                done.resolved += 1;
            }
        }
        for r in raised {
            if self.raise_one(tx, provider, subject, r).await? {
                done.opened += 1;
            }
        }
        Ok(done)
    }

    /// Opens `r` (true), opens it again if resolved (true), or refreshes
    /// its detail (false).
    async fn raise_one(
        &self,
        tx: &mut MySqlConnection,
        provider: &str,
        subject: &str,
        r: &Raised,
    ) -> Result<bool, CoordinatorError> {
        let found = sqlx::query(include_str!("../queries/settlement/exception_lock.sql"))
            .bind(provider)
            .bind(r.kind.as_str())
            .bind(subject)
            .fetch_optional(&mut *tx)
            .await
            .map_err(convert_sqlx_err)?;
        let Some(row) = found else {
            self.pause_in(crate::pause::PausePoint::SettlementRaiseAfterRead, tx)
                .await;
            let id = sqlx::query(include_str!("../queries/settlement/exception_insert.sql"))
                .bind(provider)
                .bind(r.kind.as_str())
                .bind(r.kind.severity().as_str())
                .bind(subject)
                .bind(r.job_id)
                .bind(&r.detail)
                .execute(&mut *tx)
                .await
                // Another import raised it since this one's locking read
                // found none: run again, and find it.
                .map_err(crate::errors::conflict_if_unique)?
                .last_insert_id();
            action(tx, id, "opened", OPERATOR, &r.detail).await?;
            return Ok(true);
        };
        let id: u64 = get(&row, "id")?;
        let state = text(&row, "state")?;
        let reopen = state == ExceptionState::Resolved.as_str();
        let new_state = if reopen {
            ExceptionState::Open.as_str()
        } else {
            state.as_str()
        };
        if reopen || opt_text(&row, "detail")?.as_deref() != Some(r.detail.as_str()) {
            sqlx::query(include_str!("../queries/settlement/exception_update.sql"))
                .bind(&r.detail)
                .bind(r.job_id)
                .bind(new_state)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(convert_sqlx_err)?;
        }
        if reopen {
            action(tx, id, "reopened", OPERATOR, &r.detail).await?;
        }
        Ok(reopen)
    }

    /// Which of `subjects` have an exception not resolved.
    pub async fn unresolved_subjects(
        &self,
        provider: &str,
        subjects: &[&str],
    ) -> Result<std::collections::HashSet<String>, CoordinatorError> {
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        super::on_insert::unresolved_subjects_on(&mut conn, provider, subjects).await
    }

    /// A person's action on an exception, recorded with their name and
    /// note: fenced on the state they saw. Errors:
    /// `SettlementExceptionNotFound` for an unknown exception,
    /// `SettlementExceptionMoved` when it is no longer in the state seen
    /// (someone acted first), with the state it is in.
    pub async fn act_on_settlement_exception(
        &self,
        act: &ActOnException,
    ) -> Result<SettlementException, CoordinatorError> {
        let moved = transaction!(self, |tx| self.act_in(tx, act))?;
        // Read after the transaction ended, on a connection of its own.
        let now = self.settlement_exception(act.id).await?;
        match now {
            Some(e) if moved => Ok(e),
            None if moved => Err(CoordinatorError::Internal("an exception vanished".into())),
            None => Err(CoordinatorError::SettlementExceptionNotFound { id: act.id }),
            Some(e) => Err(CoordinatorError::SettlementExceptionMoved {
                id: act.id,
                seen: act.seen,
                current: e.state,
            }),
        }
    }

    /// The action's writes: the state moved if it is still the one seen
    /// (else `false`, nothing written), and the action recorded.
    async fn act_in(&self, tx: &mut MySqlConnection, act: &ActOnException) -> Body<bool> {
        let moved = set_state(tx, act.id, act.seen.as_str(), act.to).await?;
        if !moved {
            return Ok(false);
        }
        action(tx, act.id, act.to.as_str(), &act.operator, &act.note).await?;
        Ok(true)
    }

    /// One exception with its whole life.
    pub async fn settlement_exception(
        &self,
        id: u64,
    ) -> Result<Option<SettlementException>, CoordinatorError> {
        let pool = self.pool();
        let row = sqlx::query(include_str!("../queries/settlement/exception_get.sql"))
            .bind(id)
            .fetch_optional(&pool)
            .await
            .map_err(convert_sqlx_err)?;
        let Some(row) = row else { return Ok(None) };
        let mut e = exception_row(&row)?;
        for a in sqlx::query(include_str!("../queries/settlement/exception_actions.sql"))
            .bind(id)
            .fetch_all(&pool)
            .await
            .map_err(convert_sqlx_err)?
        {
            e.actions.push(ExceptionAction {
                action: text(&a, "action")?,
                operator: text(&a, "operator")?,
                note: text(&a, "note")?,
                acted_at: get(&a, "acted_at")?,
            });
        }
        Ok(Some(e))
    }

    /// Exceptions, newest first: of `provider` when given, in one of
    /// `states` (all when empty), of a job when given, at most `limit`.
    pub async fn list_settlement_exceptions(
        &self,
        provider: Option<&str>,
        states: &[ExceptionState],
        job_id: Option<u64>,
        limit: u32,
    ) -> Result<Vec<SettlementException>, CoordinatorError> {
        let found = self
            .fetch_rows(
                sqlx::query(
                    &include_str!("../queries/settlement/exceptions_list.sql")
                        .replace("{states}", &state_list(states)),
                )
                .bind(provider)
                .bind(provider)
                .bind(job_id)
                .bind(job_id)
                .bind(limit),
            )
            .await;
        found?.iter().map(exception_row).collect()
    }

    /// How many exceptions [`list_settlement_exceptions`]
    /// (Self::list_settlement_exceptions) would list with no limit.
    pub async fn count_settlement_exceptions(
        &self,
        provider: Option<&str>,
        states: &[ExceptionState],
        job_id: Option<u64>,
    ) -> Result<u64, CoordinatorError> {
        let rows = self
            .fetch_rows(
                sqlx::query(
                    &include_str!("../queries/settlement/exceptions_count.sql")
                        .replace("{states}", &state_list(states)),
                )
                .bind(provider)
                .bind(provider)
                .bind(job_id)
                .bind(job_id),
            )
            .await?;
        let matched: i64 = match rows.first() {
            Some(row) => get(row, "matched")?,
            None => 0,
        };
        Ok(matched.max(0) as u64)
    }
}

/// `states` as a list of literals (every state when empty).
fn state_list(states: &[ExceptionState]) -> String {
    if states.is_empty() {
        "'open', 'acknowledged', 'resolved'".to_owned()
    } else {
        states
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Moves exception `id` from `from` to `to`; whether it was in `from`.
async fn set_state(
    conn: &mut MySqlConnection,
    id: u64,
    from: &str,
    to: ExceptionState,
) -> Result<bool, CoordinatorError> {
    let done = sqlx::query(include_str!("../queries/settlement/exception_state.sql"))
        .bind(to.as_str())
        .bind(id)
        .bind(from)
        .execute(conn)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(done.rows_affected() == 1)
}
