//! Settlement's storage (docs/design.md rule 15): a provider's settings,
//! its report's lines (one row per refund, by the provider's id), who
//! holds each operation key, the exceptions and their life, and the
//! periods covered. Every write is a short transaction; nothing here holds
//! a job's row lock (a manual review is resolved through the ordinary
//! fenced resolution, by the coordinator).

mod exceptions;
mod lines;
mod on_insert;
mod references;
pub mod report;

pub use exceptions::{Raised, Raising};
pub use lines::KeyLines;
pub use references::{keys_by_reference, ByReference};
pub use report::{Missing, MissingCursor, SettlementGauges};

use super::rows::{get, opt_text, text};
use super::{literal, micros, JobStore};
use crate::run::{transaction, Body};
use jobfence_domain::settlement::mapping::Mapping;
use jobfence_domain::settlement::records::{
    PutSettlementSettings, QueueAmounts, SettlementSettings,
};
use jobfence_domain::CoordinatorError;
use sqlx::MySqlConnection;
use std::time::Duration;

/// The maps of one batch's references and keys (a few thousand strings
/// a batch, each hashed several times): foldhash, seeded per process,
/// where std's SipHash showed in the coordinator's profile of an import.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// MySQL's "foreign key constraint fails" on insert.
const NO_REFERENCED_ROW: u16 = 1452;

/// The provider's queues as a list of literals, for `{queues}`.
fn queue_list(queues: &[QueueAmounts]) -> Result<String, CoordinatorError> {
    queues
        .iter()
        .map(|q| literal::queue(&q.queue))
        .collect::<Result<Vec<_>, _>>()
        .map(|l| l.join(", "))
}

/// Strings as one JSON array, the parameter of a statement that reads
/// them as a table (`JSON_TABLE(?, '$[*]' …)`, holders_jobs.sql): a batch's
/// keys or references travel once, as a bound string the server parses in
/// one pass, where a list of as many literals cost it about twice as much
/// (docs/benchmarks.md, "Settlement import").
fn json_list(values: &[&str]) -> Result<String, CoordinatorError> {
    crate::batch::json(values)
}

/// Strings as a list of literals, for `{keys}` and `{refs}`.
fn string_list<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::new();
    for (i, v) in values.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        literal::Literal::write_sql(v, &mut out);
    }
    out
}

fn unknown_provider(name: &str) -> CoordinatorError {
    CoordinatorError::invalid(
        "provider",
        format!("no provider {name:?} here (create it with `jobfence providers set`)"),
    )
}

impl JobStore {
    /// A provider's settlement settings; `None` when it has none (or does
    /// not exist).
    pub async fn settlement_settings(
        &self,
        provider: &str,
    ) -> Result<Option<SettlementSettings>, CoordinatorError> {
        let found = self
            .fetch_rows(
                sqlx::query(include_str!("../queries/settlement/settings_get.sql")).bind(provider),
            )
            .await;
        let rows = found?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        fn parse<T: std::str::FromStr<Err = jobfence_domain::UnknownValue>>(
            row: &sqlx::mysql::MySqlRow,
            column: &str,
        ) -> Result<T, CoordinatorError> {
            text(row, column)?
                .parse()
                .map_err(|e: jobfence_domain::UnknownValue| {
                    CoordinatorError::Internal(e.to_string())
                })
        }
        let mapping = Mapping {
            provider_reference: text(first, "provider_reference_column")?,
            operation_key: text(first, "operation_key_column")?,
            amount: text(first, "amount_column")?,
            amount_unit: parse(first, "amount_unit")?,
            currency: text(first, "currency_column")?,
            status: text(first, "status_column")?,
            created: text(first, "created_column")?,
            created_format: parse(first, "created_format")?,
        };
        let mut queues = Vec::new();
        for row in &rows {
            if let Some(queue) = opt_text(row, "queue")? {
                queues.push(QueueAmounts {
                    queue,
                    amount_pointer: opt_text(row, "amount_pointer")?,
                    currency_pointer: opt_text(row, "currency_pointer")?,
                });
            }
        }
        let lag_us: i64 = get(first, "lag_us")?;
        Ok(Some(SettlementSettings {
            provider: text(first, "provider")?,
            preset: opt_text(first, "preset")?,
            mapping,
            lag: Duration::from_micros(lag_us.max(0) as u64),
            queues,
        }))
    }

    /// Stores a provider's settlement settings, and the amount pointers of
    /// the queues listed (each must dispatch to the provider), recorded
    /// with the operator's name like every policy change.
    ///
    /// Errors: `InvalidArgument` for an unknown provider (field
    /// `provider`) or a queue that is not the provider's (`queues[i]`).
    pub async fn put_settlement_settings(
        &self,
        req: &PutSettlementSettings,
    ) -> Result<(), CoordinatorError> {
        transaction!(self, |tx| self.put_settlement_settings_in(tx, req))
    }

    async fn put_settlement_settings_in(
        &self,
        tx: &mut MySqlConnection,
        req: &PutSettlementSettings,
    ) -> Body<()> {
        let m = &req.mapping;
        let put = sqlx::query(include_str!("../queries/settlement/settings_put.sql"))
            .bind(&req.provider)
            .bind(req.preset.as_deref())
            .bind(&m.provider_reference)
            .bind(&m.operation_key)
            .bind(&m.amount)
            .bind(m.amount_unit.as_str())
            .bind(&m.currency)
            .bind(&m.status)
            .bind(&m.created)
            .bind(m.created_format.as_str())
            .bind(micros(req.lag))
            .bind(&req.by.operator)
            .execute(&mut *tx)
            .await;
        match put {
            Err(e) if super::errors::error_number(&e) == Some(NO_REFERENCED_ROW) => {
                return Err(unknown_provider(&req.provider).into())
            }
            other => other?,
        };
        // In the order of the queues' names, as every change of a
        // provider's queue rows takes them (docs/architecture.md, lock
        // order); the first refused queue of the request is reported.
        let mut order: Vec<(usize, _)> = req.queues.iter().enumerate().collect();
        order.sort_by(|a, b| a.1.queue.cmp(&b.1.queue));
        let mut refused: Option<usize> = None;
        for (i, q) in order {
            let done = sqlx::query(include_str!("../queries/settlement/queue_amounts_put.sql"))
                .bind(q.amount_pointer.as_deref())
                .bind(q.currency_pointer.as_deref())
                .bind(&req.by.operator)
                .bind(&q.queue)
                .bind(&req.provider)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                refused = Some(refused.map_or(i, |r| r.min(i)));
            }
        }
        if let Some(i) = refused {
            return Err(CoordinatorError::invalid(
                format!("queues[{i}]"),
                format!(
                    "queue {:?} does not dispatch to provider {:?}",
                    req.queues[i].queue, req.provider
                ),
            )
            .into());
        }
        super::providers::record(
            tx,
            &format!("provider:{}", req.provider),
            jobfence_domain::providers::PolicyAction::PutSettlement,
            &req.by,
            &settings_detail(req),
        )
        .await?;
        Ok(())
    }
}

/// The recorded change's detail (JSON).
fn settings_detail(req: &PutSettlementSettings) -> String {
    let m = &req.mapping;
    serde_json::json!({
        "preset": req.preset,
        "columns": {
            "provider_reference": m.provider_reference,
            "operation_key": m.operation_key,
            "amount": m.amount,
            "amount_unit": m.amount_unit.as_str(),
            "currency": m.currency,
            "status": m.status,
            "created": m.created,
            "created_format": m.created_format.as_str(),
        },
        "lag_s": req.lag.as_secs(),
        "queues": req.queues.iter().map(|q| serde_json::json!({
            "queue": q.queue,
            "amount_pointer": q.amount_pointer,
            "currency_pointer": q.currency_pointer,
        })).collect::<Vec<_>>(),
    })
    .to_string()
}
