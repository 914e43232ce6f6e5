//! Fair hand-out in the demo (docs/design.md rule 18): mid-run one
//! merchant sends a bulk refund, thousands at once (`arrivals.rs`), and
//! the report sets how long the other merchants' refunds waited for their
//! first hand-out against how long the bulk merchant's did.
//!
//! A refund's wait is from its job's `created_at` to its first `claimed`
//! event, both by the database clock, read at the end from the tables and
//! from the pruner's archive (the coordinators prune finished jobs during
//! the run, their events with them).

use super::arrivals::{BulkSent, BULK_MERCHANT};
use anyhow::Result;
use serde_json::Value;
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// One job's first hand-out: its merchant (fairness key), when it was
/// enqueued and when it was first handed out, in microseconds since the
/// Unix epoch (database clock, UTC).
#[derive(Debug, Clone)]
pub(super) struct Wait {
    pub(super) merchant: String,
    pub(super) enqueued: i64,
    pub(super) handed_out: i64,
}

/// Jobs by (queue, id) (ids repeat across the databases of --shards, the
/// queues do not).
pub(super) type Waits = BTreeMap<(String, u64), Wait>;

/// The bulk refund and the waits it is set against.
#[derive(Debug, Clone, Default)]
pub struct FairHandOut {
    /// Refunds of the bulk refund sent (`--bulk-refunds`).
    pub bulk_refunds: u32,
    /// When it went in, and in how many calls; `None`: it never did.
    pub(super) sent: Option<BulkSent>,
    /// Waits (enqueue to first hand-out) of the bulk merchant's refunds.
    pub bulk: Vec<Duration>,
    /// Waits of the other merchants' refunds enqueued while the bulk
    /// merchant's waited (from its first enqueue to its last first
    /// hand-out).
    pub others_meanwhile: Vec<Duration>,
    /// Waits of every other merchant's refund.
    pub others: Vec<Duration>,
}

impl FairHandOut {
    /// The waits of `waits`, the bulk refund `sent` of `bulk_refunds`.
    pub(super) fn of(waits: &Waits, bulk_refunds: u32, sent: Option<BulkSent>) -> FairHandOut {
        let wait = |w: &Wait| Duration::from_micros((w.handed_out - w.enqueued).max(0) as u64);
        let bulk: Vec<&Wait> = waits
            .values()
            .filter(|w| w.merchant == BULK_MERCHANT)
            .collect();
        let first = bulk.iter().map(|w| w.enqueued).min();
        let last = bulk.iter().map(|w| w.handed_out).max();
        let others: Vec<&Wait> = waits
            .values()
            .filter(|w| w.merchant != BULK_MERCHANT)
            .collect();
        let meanwhile = |w: &&&Wait| match (first, last) {
            (Some(a), Some(b)) => (a..=b).contains(&w.enqueued),
            _ => false,
        };
        FairHandOut {
            bulk_refunds,
            sent,
            bulk: bulk.iter().map(|w| wait(w)).collect(),
            others_meanwhile: others.iter().filter(meanwhile).map(|w| wait(w)).collect(),
            others: others.iter().map(|w| wait(w)).collect(),
        }
    }

    /// The report's lines `bulk refund` and `first hand-out p99` (the
    /// medians beside, in brackets: the p99 of a demo is its outages').
    pub(super) fn render(&self, s: &mut String) {
        let bulk = match self.sent {
            Some(sent) => format!(
                "{} refunds of {BULK_MERCHANT} at once in {} EnqueueBatch call{}, {} s into the arrivals",
                self.bulk_refunds,
                sent.calls,
                if sent.calls == 1 { "" } else { "s" },
                sent.at.as_secs()
            ),
            None if self.bulk_refunds == 0 => "none (--bulk-refunds 0)".into(),
            None => format!("{} refunds of {BULK_MERCHANT}, not sent", self.bulk_refunds),
        };
        let _ = writeln!(s, "  bulk refund             {bulk}");
        let others = format!(
            "other merchants over the whole run {} ({} refunds, median {})",
            ms(percentile(&self.others, 0.99)),
            self.others.len(),
            ms(percentile(&self.others, 0.5))
        );
        if self.bulk.is_empty() {
            let _ = writeln!(s, "  first hand-out p99      {others}");
            return;
        }
        let meanwhile = &self.others_meanwhile;
        let _ = writeln!(
            s,
            "  first hand-out p99      other merchants {}, {BULK_MERCHANT} {} (refunds enqueued \
             while {BULK_MERCHANT}'s waited: {} of the others, median {}, and {} of its own, \
             median {}); {others}",
            ms(percentile(meanwhile, 0.99)),
            ms(percentile(&self.bulk, 0.99)),
            meanwhile.len(),
            ms(percentile(meanwhile, 0.5)),
            self.bulk.len(),
            ms(percentile(&self.bulk, 0.5))
        );
    }
}

/// `d` in whole milliseconds, or `–`.
fn ms(d: Option<Duration>) -> String {
    d.map_or("–".into(), |d| format!("{} ms", d.as_millis()))
}

/// The `p` quantile (nearest rank) of `v`, if any.
fn percentile(v: &[Duration], p: f64) -> Option<Duration> {
    let mut v = v.to_vec();
    v.sort_unstable();
    let rank = (v.len() as f64 * p).ceil() as usize;
    v.get(rank.clamp(1, v.len().max(1)) - 1).copied()
}

/// The first hand-out of every job in the tables of `pools` that had one,
/// added to `waits`.
pub(super) async fn read_tables(pools: &[MySqlPool], waits: &mut Waits) -> Result<()> {
    for pool in pools {
        let rows = sqlx::query(
            "SELECT CAST(j.queue AS CHAR) AS q, j.id, CAST(j.fairness_key AS CHAR) AS k, \
               CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', j.created_at) AS SIGNED) AS enqueued, \
               CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', MIN(e.created_at)) AS SIGNED) AS handed_out \
             FROM jobs j JOIN job_events e ON e.job_id = j.id AND e.kind = 'claimed' \
             GROUP BY j.id, j.queue, j.fairness_key, j.created_at",
        )
        .fetch_all(pool)
        .await?;
        for row in &rows {
            let text = |c: &str| -> Result<String> {
                let b: Option<Vec<u8>> = row.try_get(c)?;
                Ok(String::from_utf8_lossy(&b.unwrap_or_default()).into_owned())
            };
            let wait = Wait {
                merchant: text("k")?,
                enqueued: row.try_get("enqueued")?,
                handed_out: row.try_get("handed_out")?,
            };
            waits.insert((text("q")?, row.try_get("id")?), wait);
        }
    }
    Ok(())
}

/// The first hand-out of the job of one line of the pruner's archive, if
/// it had one.
pub(super) fn archived(line: &Value) -> Option<((String, u64), Wait)> {
    let micros = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str()?)
            .ok()
            .map(|t| t.timestamp_micros())
    };
    let job = &line["job"];
    let claimed = line["events"]
        .as_array()?
        .iter()
        .find(|e| e["kind"] == "claimed")?;
    let wait = Wait {
        merchant: job["fairness_key"].as_str().unwrap_or("").to_owned(),
        enqueued: micros(&job["created_at"])?,
        handed_out: micros(&claimed["created_at"])?,
    };
    Some((
        (job["queue"].as_str()?.to_owned(), job["id"].as_u64()?),
        wait,
    ))
}
