//! A claim transaction's first round trip: the queue's stored rules (the
//! provider's row locked first, or only the queue's own row for a queue
//! without a provider) and both claim scans.

use super::budget::{self, Rules};
use super::reads::LockedJob;
use super::{batch, literal, with_job_columns};
use jobfence_domain::CoordinatorError;
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;
use std::sync::LazyLock;

static SCAN_EXPIRED: LazyLock<String> = LazyLock::new(|| {
    literal::bare(&with_job_columns(include_str!(
        "../queries/jobs/scan_expired.sql"
    )))
});
static SCAN_READY: LazyLock<String> = LazyLock::new(|| {
    literal::bare(&with_job_columns(include_str!(
        "../queries/jobs/scan_ready.sql"
    )))
});

/// What a claim transaction read in its first round trip.
pub(super) struct Scan {
    pub(super) rules: Rules,
    /// Running jobs whose lease expired (inline takeovers), then due
    /// ready jobs.
    pub(super) expired: Vec<LockedJob>,
    pub(super) ready: Vec<LockedJob>,
}

/// The queue's stored rules (its provider's row locked first; see
/// `budget.rs`) and both claim scans, as one text query (one round trip):
/// running jobs whose lease expired, then due ready jobs, each up to
/// `limit` rows and locked with SKIP LOCKED. When the first scan finds
/// some, the second may lock a few more ready rows than are handed out;
/// they are released at the claim's commit, as are rows the budget holds
/// back. `reconcile_only` limits the ready scan to jobs whose next action
/// is `reconcile` (a provider whose sends are paused).
///
/// `light`: the queue is believed to have no provider, so only its own
/// row is read (one statement instead of three) and the scans are guarded
/// to find nothing if it has one after all: `None` then, nothing locked,
/// and the caller scans again with the full rules. `exclude`: jobs the
/// transaction is writing itself, left out of the expired-lease scan.
pub(super) async fn scan(
    conn: &mut MySqlConnection,
    queue: &str,
    limit: u32,
    reconcile_only: bool,
    light: bool,
    exclude: &[u64],
) -> Result<Option<Scan>, CoordinatorError> {
    let q = literal::queue(queue)?;
    let exclude = match exclude {
        [] => String::new(),
        ids => format!(
            "AND id NOT IN ({})",
            ids.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let guard = match light {
        true => budget::no_provider_guard(queue)?,
        false => String::new(),
    };
    let fill = |sql: &str| {
        sql.replace("{queue}", &q)
            .replace("{limit}", &limit.to_string())
            .replace(
                "{only}",
                if reconcile_only {
                    "AND next_action = 'reconcile'"
                } else {
                    ""
                },
            )
            .replace("{guard}", &guard)
            .replace("{exclude}", &exclude)
    };
    let mut statements = match light {
        true => vec![budget::queue_row_statement(queue)?],
        false => budget::rules_statements(queue)?,
    };
    let rules_results = statements.len();
    statements.push(fill(&SCAN_EXPIRED));
    statements.push(fill(&SCAN_READY));
    let mut sets = batch::result_sets(conn, &statements.join(";\n")).await?;
    if sets.len() != rules_results + 2 {
        return Err(CoordinatorError::Internal(format!(
            "a claim's scan gave {} result sets",
            sets.len()
        )));
    }
    let ready = locked_jobs(&sets.pop().unwrap_or_default())?;
    let expired = locked_jobs(&sets.pop().unwrap_or_default())?;
    let rules = match light {
        true => match Rules::from_queue_row(&sets[0])? {
            Some(rules) => rules,
            None => return Ok(None),
        },
        false => Rules::parse(queue, &sets)?,
    };
    Ok(Some(Scan {
        rules,
        expired,
        ready,
    }))
}

fn locked_jobs(rows: &[MySqlRow]) -> Result<Vec<LockedJob>, CoordinatorError> {
    rows.iter().map(batch::locked_job).collect()
}
