//! A claim transaction's first round trip: the queue's stored rules (the
//! provider's row locked first, or only the queue's own row for a queue
//! without a provider) and the ready scan, prepared once per session; the
//! expired-lease scan only when a lease ran out, in a second round trip.

use super::budget::{self, Rules};
use super::reads::LockedJob;
use super::{batch, literal, with_job_columns};
use crate::errors::{code, error_number};
use crate::pause::PausePoint;
use crate::{convert_sqlx_err, JobStore};
use jobfence_domain::CoordinatorError;
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;
use std::collections::HashMap;
use std::sync::LazyLock;

static SCAN_EXPIRED: LazyLock<String> = LazyLock::new(|| {
    literal::bare(&with_job_columns(include_str!(
        "../queries/jobs/scan_expired.sql"
    )))
});
static SCAN_UNPLACED: LazyLock<String> = LazyLock::new(|| {
    literal::bare(&with_job_columns(include_str!(
        "../queries/jobs/scan_unplaced.sql"
    )))
});
static SCAN_READY: LazyLock<String> = LazyLock::new(|| {
    literal::bare(&with_job_columns(include_str!(
        "../queries/jobs/scan_ready.sql"
    )))
});

/// What a claim transaction's scans read.
pub(crate) struct Scan {
    pub(super) rules: Rules,
    /// Running jobs whose lease expired (inline takeovers), then due
    /// ready jobs.
    pub(super) expired: Vec<LockedJob>,
    pub(super) ready: Vec<LockedJob>,
    /// Due ready jobs not yet placed in the fair order (delayed; rule
    /// 18), for the claim to place.
    pub(super) unplaced: Vec<LockedJob>,
}

/// How a claim reads its queue's rules in its first round trip, as the
/// store's last claim of the queue found them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reads {
    /// Only the queue's own row (one primary-key read): the queue had no
    /// provider.
    QueueRow,
    /// The provider's row and the rows of its queues, locked in one
    /// statement, and (`in_flight`) the count of the provider's jobs in
    /// flight: the queue had a provider, with an in-flight cap when
    /// `in_flight`.
    Provider { in_flight: bool },
}

impl Reads {
    /// The reads for a claim of `queue`, from what the store's last claim
    /// of it found.
    pub(super) fn for_queue(store: &JobStore, queue: &str) -> Reads {
        match store.provider_queues.get(queue) {
            None => Reads::QueueRow,
            Some(seen) => Reads::Provider {
                in_flight: seen.capped,
            },
        }
    }
}

/// The queue's stored rules and both claim scans, the reads prepared
/// once per session and sent with `EXECUTE` (see [`prepare_text`]), in
/// one round trip: `SET` of the parameters, the rules as `reads` says,
/// and the scan of due ready jobs, up to `limit` rows locked with SKIP
/// LOCKED. The expired-lease scan is sent only when the queue's row says
/// a lease ran out (and the queue is not paused), or when the queue's row
/// is not among its provider's (see [`finish`]), in a second round trip
/// after the ready scan; the rows are the same either way, SKIP LOCKED
/// never waits, and the claim acts on the rules it read, as one that
/// began a moment earlier would. `exclude`: jobs the transaction writes
/// itself, left out of the expired-lease scan.
///
/// With [`Reads::QueueRow`], `None` when the queue's row names a provider
/// after all: the caller scans again with [`Reads::Provider`], in the same
/// transaction; the rows the first ready scan locked are found again (a
/// transaction does not skip its own locks), and it hands out only what
/// the budget allows. The provider's row is then locked after job rows,
/// as a Takeover's is, and nobody who holds a provider row waits for a
/// job row (`budget.rs`, lock order). With [`Reads::Provider`], the
/// provider's row is locked before the scan's rows; when it has an
/// in-flight cap and the count was not sent, the count goes with the
/// second round trip, still under the provider's lock.
pub(super) async fn scan(
    store: &JobStore,
    conn: &mut MySqlConnection,
    queue: &str,
    limit: u32,
    reads: Reads,
    exclude: &[u64],
) -> Result<Option<Scan>, CoordinatorError> {
    let text = reads_text(queue, limit, None, reads)?;
    let sets = reads_sets(prepared_reads(conn, &text).await?, 2 + rules_sets(reads))?;
    let scan_expired = fill(&SCAN_EXPIRED, queue, limit, false, exclude)?;
    finish(store, conn, sets, queue, reads, scan_expired).await
}

/// The due jobs of `queue` whose next action is `reconcile`, up to
/// `limit`, locked with SKIP LOCKED: the second scan of a claim whose
/// provider's sends are paused, as text (rare enough not to prepare).
pub(super) async fn scan_reconciles(
    conn: &mut MySqlConnection,
    queue: &str,
    limit: u32,
) -> Result<Vec<LockedJob>, CoordinatorError> {
    let mut sets = batch::result_sets(conn, &fill(&SCAN_READY, queue, limit, true, &[])?).await?;
    locked_jobs(&sets.pop().unwrap_or_default())
}

/// One of the claim scans' SQL with the queue and the limit written in as
/// literals, `{only}` and `{exclude}` filled (see [`scan`]).
fn fill(
    sql: &str,
    queue: &str,
    limit: u32,
    reconcile_only: bool,
    exclude: &[u64],
) -> Result<String, CoordinatorError> {
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
    let only = match reconcile_only {
        true => "AND next_action = 'reconcile'",
        false => "",
    };
    Ok(sql
        .replace("{queue}", &literal::queue(queue)?)
        .replace("{limit}", &limit.to_string())
        .replace("{only}", only)
        .replace("{exclude}", &exclude))
}

/// The name of the session's prepared queue-row statement.
const QUEUE_ROW_STMT: &str = "jf_claim_queue_row";
/// The names of the session's prepared rules statements (the provider's
/// row and its queues' rows, the jobs in flight;
/// `budget::rules_templates`).
const RULES_STMTS: [&str; 2] = ["jf_claim_provider_queues", "jf_claim_in_flight"];
/// The name of the session's prepared ready scan (any queue, any limit).
const SCAN_READY_STMT: &str = "jf_claim_scan_ready";
/// The name of the session's prepared scan of due jobs not yet placed.
const SCAN_UNPLACED_STMT: &str = "jf_claim_scan_unplaced";
/// The name of the session's prepared lock of one job (a handoff's write,
/// see [`lock_and_scan`]).
const LOCK_JOB_STMT: &str = "jf_handoff_lock_job";

/// PREPARE of a claim's reads: the queue's own row, the rules of a queue
/// with a provider and the ready scan, with the queue and the limit as
/// parameters, and of the one-job lock a lone handoff sends before them:
/// run by a session of the batch pool at its first claim (see
/// [`prepared_reads`]). A claim sends them with EXECUTE instead of their
/// text, which the server parsed on every claim (about half of the
/// database CPU a lone worker's job cost beyond the direct SQL's). Still
/// one round trip: `SET` of the parameters and the EXECUTEs, as text.
fn prepare_text() -> &'static str {
    static TEXT: LazyLock<String> = LazyLock::new(|| {
        let ready = SCAN_READY
            .replace("{queue}", "?")
            .replace("{limit}", "?")
            .replace("{only}", "");
        let lock =
            with_job_columns(include_str!("../queries/batch/lock_jobs.sql")).replace("{ids}", "?");
        let unplaced = SCAN_UNPLACED
            .replace("{queue}", "?")
            .replace("{limit}", "?");
        let rules = budget::rules_templates();
        let mut statements = vec![
            (QUEUE_ROW_STMT, budget::queue_row_template()),
            (SCAN_READY_STMT, ready),
            (SCAN_UNPLACED_STMT, unplaced),
            (LOCK_JOB_STMT, literal::bare(&lock)),
        ];
        statements.extend(RULES_STMTS.into_iter().zip(rules.map(|(sql, _)| sql)));
        statements
            .iter()
            .map(|(name, sql)| format!("PREPARE {name} FROM '{}'", sql.replace('\'', "''")))
            .collect::<Vec<_>>()
            .join(";\n")
    });
    &TEXT
}

/// `EXECUTE` of the prepared rules statement `k` (see [`RULES_STMTS`]),
/// the queue given as often as the statement names it.
fn execute_rules(k: usize) -> String {
    static COUNTS: LazyLock<[usize; 2]> =
        LazyLock::new(|| budget::rules_templates().map(|(_, n)| n));
    format!(
        "EXECUTE {} USING {}",
        RULES_STMTS[k],
        vec!["@jf_queue"; COUNTS[k]].join(", ")
    )
}

/// Runs a claim's prepared reads (`text`: the `SET` and the EXECUTEs).
/// A session that has not prepared them yet (its first claim; the
/// server answers "unknown prepared statement") prepares them and runs
/// them again, in the same transaction: neither the failed EXECUTE nor a
/// PREPARE ends it, and the SET is sent again. Prepared here rather than
/// in the session's setup, so that a schema not migrated yet fails the
/// claims, with their own error, and not every connection of the pool.
async fn prepared_reads(
    conn: &mut MySqlConnection,
    text: &str,
) -> Result<Vec<Vec<MySqlRow>>, CoordinatorError> {
    match batch::result_sets_raw(conn, text).await {
        Err(e) if error_number(&e) == Some(code::UNKNOWN_STMT_HANDLER) => {
            batch::result_sets(conn, prepare_text()).await?;
            batch::result_sets(conn, text).await
        }
        other => other.map_err(convert_sqlx_err),
    }
}

/// A claim's first round trip: `SET` of the parameters, the lock of job
/// `lock` first when a handoff writes it (the same lock as
/// `batch::lock_jobs`), the rules as `reads` says, and the ready scan.
fn reads_text(
    queue: &str,
    limit: u32,
    lock: Option<u64>,
    reads: Reads,
) -> Result<String, CoordinatorError> {
    // The queue in the column's own character set and collation, so the
    // server compares it as it would a literal and reads the index.
    let queue = literal::queue(queue)?;
    let mut out = vec![match lock {
        None => format!("SET @jf_queue = _ascii {queue} COLLATE ascii_bin, @jf_limit = {limit}"),
        Some(id) => format!(
            "SET @jf_job = {id}, @jf_queue = _ascii {queue} COLLATE ascii_bin, \
             @jf_limit = {limit}"
        ),
    }];
    if lock.is_some() {
        out.push(format!("EXECUTE {LOCK_JOB_STMT} USING @jf_job"));
    }
    match reads {
        Reads::QueueRow => out.push(format!(
            "EXECUTE {QUEUE_ROW_STMT} USING @jf_queue, @jf_queue"
        )),
        Reads::Provider { in_flight } => {
            out.push(execute_rules(0));
            if in_flight {
                out.push(execute_rules(1));
            }
        }
    }
    out.push(format!(
        "EXECUTE {SCAN_READY_STMT} USING @jf_queue, @jf_limit"
    ));
    out.push(format!(
        "EXECUTE {SCAN_UNPLACED_STMT} USING @jf_queue, @jf_limit"
    ));
    Ok(out.join(";\n"))
}

/// The result sets of [`reads_text`], checked: the `SET`'s (empty), then
/// `expected` more.
fn reads_sets(
    mut sets: Vec<Vec<MySqlRow>>,
    expected: usize,
) -> Result<Vec<Vec<MySqlRow>>, CoordinatorError> {
    // The SET answers with no rows: an empty first set.
    if sets.len() != expected + 1 || !sets[0].is_empty() {
        return Err(CoordinatorError::Internal(format!(
            "a claim's reads gave {} result sets ({} expected, the first empty)",
            sets.len(),
            expected + 1
        )));
    }
    sets.remove(0);
    Ok(sets)
}

/// How many result sets the rules of `reads` give.
fn rules_sets(reads: Reads) -> usize {
    match reads {
        Reads::QueueRow => 1,
        Reads::Provider { in_flight } => 1 + usize::from(in_flight),
    }
}

/// [`scan`] from its first round trip's result sets (`sets`, the `SET`'s
/// and any lock's removed): the rules, then the ready scan. What the rules
/// say is missing goes in a second round trip: the expired-lease scan
/// (`scan_expired`) when a lease ran out, the count of jobs in flight when
/// the provider has a cap and it was not sent, and the queue's own row
/// when it is not among the locked provider's queues (the queue lost its
/// provider, or moved to another, since its last claim here; the
/// expired-lease scan is then sent too, whatever that row says).
async fn finish(
    store: &JobStore,
    conn: &mut MySqlConnection,
    mut sets: Vec<Vec<MySqlRow>>,
    queue: &str,
    reads: Reads,
    scan_expired: String,
) -> Result<Option<Scan>, CoordinatorError> {
    let unplaced = locked_jobs(&sets.pop().unwrap_or_default())?;
    let ready = locked_jobs(&sets.pop().unwrap_or_default())?;
    let mut second = Vec::new();
    let mut own_row = false;
    let (rules, want_expired) = match reads {
        Reads::QueueRow => match Rules::from_queue_row(&sets[0])? {
            None => return Ok(None),
            // A paused queue hands out nothing: no expired lease to lock.
            Some((rules, any)) => {
                let want = any && !rules.queue_paused;
                (Some(rules), want)
            }
        },
        Reads::Provider { in_flight } => {
            if !in_flight && Rules::capped(&sets[0])? {
                second.push(execute_rules(1));
            }
            own_row = !Rules::owns(queue, &sets[0])?;
            if own_row {
                second.push(format!(
                    "EXECUTE {QUEUE_ROW_STMT} USING @jf_queue, @jf_queue"
                ));
                (None, true)
            } else {
                (None, Rules::expired_scan_wanted(queue, &sets[0])?)
            }
        }
    };
    if want_expired {
        second.push(scan_expired);
    }
    let mut expired = Vec::new();
    let mut own = Vec::new();
    if !second.is_empty() {
        store.pause(PausePoint::ClaimBetweenScans).await;
        let mut more = batch::result_sets(conn, &second.join(";\n")).await?;
        if want_expired {
            expired = locked_jobs(&more.pop().unwrap_or_default())?;
        }
        if own_row {
            own = more.pop().unwrap_or_default();
        }
        sets.extend(more);
    }
    let rules = match rules {
        Some(rules) => rules,
        None => {
            sets.resize_with(budget::RULES_RESULTS, Vec::new);
            Rules::parse_or_own_row(queue, &sets, &own)?.0
        }
    };
    Ok(Some(Scan {
        rules,
        expired,
        ready,
        unplaced,
    }))
}

/// A handoff's first round trip when it writes one job (a lone worker's
/// Complete or Fail that asks for its next job): the lock of the written
/// job `job_id`, then the claim's reads ([`scan`]), in one round trip
/// instead of two. The job is locked first, as when the two are sent
/// apart, so the lock order is the same: a job row, then (with
/// [`Reads::Provider`]) the provider's row, as a Takeover's. Its lock
/// (absent when the job does not exist), and the scan of `queue` (`None`:
/// the queue's row names a provider, scan again with the provider's
/// reads), the written job left out of the expired-lease scan.
pub(super) async fn lock_and_scan(
    store: &JobStore,
    conn: &mut MySqlConnection,
    job_id: u64,
    queue: &str,
    limit: u32,
    reads: Reads,
) -> Result<(HashMap<u64, LockedJob>, Option<Scan>), CoordinatorError> {
    let text = reads_text(queue, limit, Some(job_id), reads)?;
    let mut sets = reads_sets(prepared_reads(conn, &text).await?, 3 + rules_sets(reads))?;
    let locked = sets
        .remove(0)
        .iter()
        .map(|row| batch::locked_job(row).map(|l| (l.job.id, l)))
        .collect::<Result<HashMap<_, _>, _>>()?;
    let scan_expired = fill(&SCAN_EXPIRED, queue, limit, false, &[job_id])?;
    let scan = finish(store, conn, sets, queue, reads, scan_expired).await?;
    Ok((locked, scan))
}

fn locked_jobs(rows: &[MySqlRow]) -> Result<Vec<LockedJob>, CoordinatorError> {
    rows.iter().map(batch::locked_job).collect()
}
