//! The settlement of one provider at a glance, the covered periods, and
//! the checks run over them at the end of an import (a succeeded job with
//! no refund in the reports).

use super::{queue_list, string_list};
use crate::rows::{get, text};
use crate::run::{read, Body};
use crate::{convert_sqlx_err, micros, JobStore};
use jobfence_domain::settlement::records::{CoveredPeriod, ProviderSettlement, SettlementSettings};
use jobfence_domain::settlement::{ExceptionKind, ExceptionState, OPERATOR};
use jobfence_domain::{CoordinatorError, DbTime};
use sqlx::MySqlConnection;

/// A succeeded job (or key record) with no settled refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    pub job_id: u64,
    pub operation_key: String,
    pub finished_at: DbTime,
}

/// Where a page of [`JobStore::missing_at_provider`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingCursor {
    /// From the first job.
    #[default]
    Start,
    /// After this job of `jobs` (by finished time, then id).
    Job { finished_at: DbTime, id: u64 },
    /// After this job id of the key records (the jobs are done).
    Key { job_id: u64 },
    /// Nothing left.
    Done,
}

impl JobStore {
    /// Undecides the provider's settled lines whose job has failed or been
    /// cancelled and whose key has no REFUND_NOT_RECORDED or DOUBLE_REFUND
    /// exception (in any state): lines decided while their job was still
    /// ready or running, then kept as an observation for its reconcile.
    /// The import deciding what is undecided then raises
    /// REFUND_NOT_RECORDED for them (docs/design.md rule 15). Chosen by
    /// what was raised, not by time: a decision reads its job unlocked, so
    /// a line can be marked decided after its job ended. The number of
    /// lines. Run again on a conflict (a lock wait on a line another
    /// import holds).
    pub async fn undecide_lines_of_ended_jobs(
        &self,
        settings: &SettlementSettings,
    ) -> Result<u64, CoordinatorError> {
        if settings.queues.is_empty() {
            return Ok(0);
        }
        let sql = include_str!("../queries/settlement/lines_of_ended_jobs.sql")
            .replace("{provider}", &crate::literal::provider(&settings.provider)?)
            .replace("{queues}", &queue_list(&settings.queues)?);
        self.retry_conflicts(|| async {
            use sqlx::Executor as _;
            let done = (&self.pool())
                .execute(sqlx::raw_sql(&sql))
                .await
                .map_err(convert_sqlx_err)?;
            Ok(done.rows_affected())
        })
        .await
    }

    /// Records that the provider's report covered `[start, end)`.
    pub async fn record_settlement_period(
        &self,
        provider: &str,
        start: DbTime,
        end: DbTime,
        by: &str,
    ) -> Result<(), CoordinatorError> {
        sqlx::query(include_str!("../queries/settlement/period_record.sql"))
            .bind(provider)
            .bind(start)
            .bind(end)
            .bind(by)
            .execute(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        Ok(())
    }

    /// One page (at most `limit`) of the provider's succeeded jobs, then of
    /// its key records, that finished inside a covered period longer ago
    /// than `lag` and have no settled refund; and where the next page
    /// starts.
    pub async fn missing_at_provider(
        &self,
        settings: &SettlementSettings,
        after: MissingCursor,
        limit: u32,
    ) -> Result<(Vec<Missing>, MissingCursor), CoordinatorError> {
        if settings.queues.is_empty() {
            return Ok((Vec::new(), MissingCursor::Done));
        }
        let queues = queue_list(&settings.queues)?;
        let provider = string_list([settings.provider.as_str()]);
        let lag = micros(settings.lag);
        let read = |sql: &str| {
            sql.replace("{queues}", &queues)
                .replace("{provider}", &provider)
        };
        let pool = self.pool();
        let (rows, jobs) = match after {
            MissingCursor::Done => return Ok((Vec::new(), MissingCursor::Done)),
            MissingCursor::Start | MissingCursor::Job { .. } => {
                let (t, id) = match after {
                    MissingCursor::Job { finished_at, id } => (finished_at, id),
                    _ => (DbTime::default(), 0),
                };
                let rows = sqlx::query(&read(include_str!(
                    "../queries/settlement/missing_jobs.sql"
                )))
                .bind(lag)
                .bind(t)
                .bind(t)
                .bind(id)
                .bind(limit)
                .fetch_all(&pool)
                .await
                .map_err(convert_sqlx_err)?;
                (rows, true)
            }
            MissingCursor::Key { job_id } => {
                let rows = sqlx::query(&read(include_str!(
                    "../queries/settlement/missing_keys.sql"
                )))
                .bind(lag)
                .bind(job_id)
                .bind(limit)
                .fetch_all(&pool)
                .await
                .map_err(convert_sqlx_err)?;
                (rows, false)
            }
        };
        let found = rows
            .iter()
            .map(|r| {
                Ok(Missing {
                    job_id: get(r, "job_id")?,
                    operation_key: text(r, "operation_key")?,
                    finished_at: get(r, "finished_at")?,
                })
            })
            .collect::<Result<Vec<_>, CoordinatorError>>()?;
        let next = match (found.last(), found.len() as u32 == limit, jobs) {
            (Some(m), true, true) => MissingCursor::Job {
                finished_at: m.finished_at,
                id: m.job_id,
            },
            (_, false, true) => MissingCursor::Key { job_id: 0 },
            (Some(m), true, false) => MissingCursor::Key { job_id: m.job_id },
            _ => MissingCursor::Done,
        };
        Ok((found, next))
    }

    /// One provider's settlement: periods covered, lines by status, keys
    /// matched, manual reviews resolved, exceptions by kind and state.
    pub async fn provider_settlement(
        &self,
        settings: &SettlementSettings,
    ) -> Result<ProviderSettlement, CoordinatorError> {
        read!(self, |conn| self.provider_settlement_in(conn, settings))
    }

    async fn provider_settlement_in(
        &self,
        conn: &mut MySqlConnection,
        settings: &SettlementSettings,
    ) -> Body<ProviderSettlement> {
        let p = settings.provider.as_str();
        let mut out = ProviderSettlement {
            provider: p.to_owned(),
            ..ProviderSettlement::default()
        };
        for row in sqlx::query(include_str!("../queries/settlement/periods.sql"))
            .bind(p)
            .fetch_all(&mut *conn)
            .await?
        {
            out.periods.push(CoveredPeriod {
                start: get(&row, "period_start")?,
                end: get(&row, "period_end")?,
                last_imported_at: get(&row, "last_imported_at")?,
                last_imported_by: text(&row, "last_imported_by")?,
            });
        }
        for row in sqlx::query(include_str!("../queries/settlement/line_counts.sql"))
            .bind(p)
            .fetch_all(&mut *conn)
            .await?
        {
            out.lines
                .push((text(&row, "status")?, get::<i64>(&row, "n")?.max(0) as u64));
        }
        for row in sqlx::query(include_str!("../queries/settlement/exception_counts.sql"))
            .bind(p)
            .fetch_all(&mut *conn)
            .await?
        {
            let parse =
                |e: jobfence_domain::UnknownValue| CoordinatorError::Internal(e.to_string());
            let kind: ExceptionKind = text(&row, "kind")?.parse().map_err(parse)?;
            let state: ExceptionState = text(&row, "state")?.parse().map_err(parse)?;
            out.exceptions
                .push((kind, state, get::<i64>(&row, "n")?.max(0) as u64));
        }
        out.amounts_not_compared = settings
            .queues
            .iter()
            .filter(|q| q.amount_pointer.is_none() || q.currency_pointer.is_none())
            .map(|q| q.queue.clone())
            .collect();
        if settings.queues.is_empty() {
            return Ok(out);
        }
        let queues = queue_list(&settings.queues)?;
        let matched: i64 = sqlx::query_scalar(
            &include_str!("../queries/settlement/matched_count.sql").replace("{queues}", &queues),
        )
        .bind(p)
        .fetch_one(&mut *conn)
        .await?;
        out.matched = matched.max(0) as u64;
        let resolved: i64 = sqlx::query_scalar(
            &include_str!("../queries/settlement/resolved_reviews.sql")
                .replace("{queues}", &queues),
        )
        .bind(format!("%\"operator\":\"{OPERATOR}\"%"))
        .fetch_one(&mut *conn)
        .await?;
        out.resolved_reviews = resolved.max(0) as u64;
        Ok(out)
    }

    /// The providers of this database with settlement settings.
    pub async fn settlement_providers(&self) -> Result<Vec<String>, CoordinatorError> {
        let names: Vec<String> =
            sqlx::query_scalar(include_str!("../queries/settlement/providers.sql"))
                .fetch_all(&self.pool())
                .await
                .map_err(convert_sqlx_err)?;
        Ok(names)
    }
}

/// One provider's settlement as its gauges show it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SettlementGauges {
    pub provider: String,
    /// Exceptions open or acknowledged, by kind and state.
    pub unresolved: Vec<(ExceptionKind, ExceptionState, u64)>,
    /// Unix seconds.
    pub newest_period_end: Option<f64>,
    /// Unix seconds.
    pub last_import: Option<f64>,
}

impl JobStore {
    /// Every provider with settlement settings here, as its gauges show it.
    pub async fn settlement_gauges(&self) -> Result<Vec<SettlementGauges>, CoordinatorError> {
        let pool = self.pool();
        let mut out: Vec<SettlementGauges> = Vec::new();
        for row in sqlx::query(include_str!("../queries/settlement/gauges_periods.sql"))
            .fetch_all(&pool)
            .await
            .map_err(convert_sqlx_err)?
        {
            let secs = |c: &str| -> Result<Option<f64>, CoordinatorError> {
                Ok(get::<Option<i64>>(&row, c)?.map(|us| us as f64 / 1e6))
            };
            out.push(SettlementGauges {
                provider: text(&row, "provider")?,
                unresolved: Vec::new(),
                newest_period_end: secs("newest_end_us")?,
                last_import: secs("last_import_us")?,
            });
        }
        for row in sqlx::query(include_str!("../queries/settlement/gauges_exceptions.sql"))
            .fetch_all(&pool)
            .await
            .map_err(convert_sqlx_err)?
        {
            let provider = text(&row, "provider")?;
            let kind: ExceptionKind =
                text(&row, "kind")?
                    .parse()
                    .map_err(|e: jobfence_domain::UnknownValue| {
                        CoordinatorError::Internal(e.to_string())
                    })?;
            let state: ExceptionState =
                text(&row, "state")?
                    .parse()
                    .map_err(|e: jobfence_domain::UnknownValue| {
                        CoordinatorError::Internal(e.to_string())
                    })?;
            let n = get::<i64>(&row, "n")?.max(0) as u64;
            if let Some(g) = out.iter_mut().find(|g| g.provider == provider) {
                g.unresolved.push((kind, state, n));
            }
        }
        Ok(out)
    }
}
