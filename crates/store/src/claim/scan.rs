//! A claim transaction's first round trip: the queue's stored rules (the
//! provider's row locked first, or only the queue's own row for a queue
//! without a provider) and both claim scans (for a queue without a
//! provider, the expired-lease scan only when a lease ran out).

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
static SCAN_READY: LazyLock<String> = LazyLock::new(|| {
    literal::bare(&with_job_columns(include_str!(
        "../queries/jobs/scan_ready.sql"
    )))
});

/// What a claim transaction's scans read.
pub(super) struct Scan {
    pub(super) rules: Rules,
    /// Running jobs whose lease expired (inline takeovers), then due
    /// ready jobs.
    pub(super) expired: Vec<LockedJob>,
    pub(super) ready: Vec<LockedJob>,
}

/// The queue's stored rules (its provider's row locked first; see
/// `budget.rs`) and both claim scans, as one text query (one round trip;
/// see `light` below for the one exception): running jobs whose lease
/// expired, then due ready jobs, each up to
/// `limit` rows and locked with SKIP LOCKED. When the first scan finds
/// some, the second may lock a few more ready rows than are handed out;
/// they are released at the claim's commit, as are rows the budget holds
/// back. `reconcile_only` limits the ready scan to jobs whose next action
/// is `reconcile` (a provider whose sends are paused).
///
/// `light`: the queue is believed to have no provider, so only its own
/// row is read (one statement instead of three). If the row names a
/// provider after all: `None`, and the caller scans again with the full
/// rules, in the same transaction; the rows the light ready scan locked
/// are found again by the full one (a transaction does not skip its own
/// locks), and it hands out only what the budget allows. Its provider's
/// row is then locked after job rows, as a Takeover's is, and nobody who
/// holds a provider row waits for a job row (`budget.rs`, lock order). A
/// guard that emptied the light scan in that case cost every claim a
/// subquery for a case that comes once per provider given to a queue.
/// The row also says whether any lease of the queue ran out; the
/// expired-lease scan is sent only then (and not for a paused queue), in
/// a round trip of its own after the ready scan (the rows are the same;
/// SKIP LOCKED never waits, so the order of the two locking reads cannot
/// deadlock). `exclude`: jobs the transaction is writing itself, left out
/// of the expired-lease scan.
pub(super) async fn scan(
    store: &JobStore,
    conn: &mut MySqlConnection,
    queue: &str,
    limit: u32,
    reconcile_only: bool,
    light: bool,
    exclude: &[u64],
) -> Result<Option<Scan>, CoordinatorError> {
    let fill = |sql: &str| fill(sql, queue, limit, reconcile_only, exclude);
    debug_assert!(
        !(light && reconcile_only),
        "the light scan has no reconcile-only form"
    );
    if light {
        // The expired-lease scan, when sent, comes after the ready scan
        // has locked rows: a provider given to the queue meanwhile does
        // not change what it finds, so a newer ready job never goes out
        // before an expired lease (the claim acts on the rules it read,
        // as one that began a moment earlier would).
        let text = light_text(queue, limit, None)?;
        let sets = light_reads(conn, &text).await?;
        return finish_light(store, conn, sets, fill(&SCAN_EXPIRED)?).await;
    }
    let mut statements = budget::rules_statements(queue)?;
    let rules_results = statements.len();
    statements.push(fill(&SCAN_EXPIRED)?);
    statements.push(fill(&SCAN_READY)?);
    let mut sets = batch::result_sets(conn, &statements.join(";\n")).await?;
    if sets.len() != rules_results + 2 {
        return Err(CoordinatorError::Internal(format!(
            "a claim's scan gave {} result sets",
            sets.len()
        )));
    }
    let ready = locked_jobs(&sets.pop().unwrap_or_default())?;
    let expired = locked_jobs(&sets.pop().unwrap_or_default())?;
    Ok(Some(Scan {
        rules: Rules::parse(queue, &sets)?,
        expired,
        ready,
    }))
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
/// The name of the session's prepared ready scan (any queue, any limit).
const SCAN_READY_STMT: &str = "jf_claim_scan_ready";
/// The name of the session's prepared lock of one job (a handoff's write,
/// see [`lock_and_scan_light`]).
const LOCK_JOB_STMT: &str = "jf_handoff_lock_job";

/// PREPARE of the light claim's two reads, the queue's own row and the
/// ready scan, with the queue and the limit as parameters, and of the
/// one-job lock a lone handoff sends before them: run by a session of the
/// batch pool at its first light claim (see [`light_reads`]). A lone
/// worker's claim sends them with EXECUTE instead of their text, which
/// the server parsed on every claim (about half of the database CPU a
/// lone worker's job cost beyond the direct SQL's). Still one round trip:
/// `SET` of the parameters and the EXECUTEs, as text.
fn prepare_text() -> &'static str {
    static TEXT: LazyLock<String> = LazyLock::new(|| {
        let ready = SCAN_READY
            .replace("{queue}", "?")
            .replace("{limit}", "?")
            .replace("{only}", "");
        let lock =
            with_job_columns(include_str!("../queries/batch/lock_jobs.sql")).replace("{ids}", "?");
        [
            (QUEUE_ROW_STMT, budget::queue_row_template()),
            (SCAN_READY_STMT, ready),
            (LOCK_JOB_STMT, literal::bare(&lock)),
        ]
        .iter()
        .map(|(name, sql)| format!("PREPARE {name} FROM '{}'", sql.replace('\'', "''")))
        .collect::<Vec<_>>()
        .join(";\n")
    });
    &TEXT
}

/// Runs the light claim's reads (`text`: the `SET` and the EXECUTEs).
/// A session that has not prepared them yet (its first light claim; the
/// server answers "unknown prepared statement") prepares them and runs
/// them again, in the same transaction: neither the failed EXECUTE nor a
/// PREPARE ends it, and the SET is sent again. Prepared here rather than
/// in the session's setup, so that a schema not migrated yet fails the
/// claims, with their own error, and not every connection of the pool.
async fn light_reads(
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

/// The light claim's one round trip: `SET` of the parameters, the lock
/// of job `lock` first when a handoff writes it (the same lock as
/// `batch::lock_jobs`), the queue's own row and the ready scan.
fn light_text(queue: &str, limit: u32, lock: Option<u64>) -> Result<String, CoordinatorError> {
    // The queue in the column's own character set and collation, so the
    // server compares it as it would a literal and reads the index.
    let queue = literal::queue(queue)?;
    Ok(match lock {
        None => format!(
            "SET @jf_queue = _ascii {queue} COLLATE ascii_bin, @jf_limit = {limit};\n\
             EXECUTE {QUEUE_ROW_STMT} USING @jf_queue, @jf_queue;\n\
             EXECUTE {SCAN_READY_STMT} USING @jf_queue, @jf_limit"
        ),
        Some(id) => format!(
            "SET @jf_job = {id}, @jf_queue = _ascii {queue} COLLATE ascii_bin, \
             @jf_limit = {limit};\n\
             EXECUTE {LOCK_JOB_STMT} USING @jf_job;\n\
             EXECUTE {QUEUE_ROW_STMT} USING @jf_queue, @jf_queue;\n\
             EXECUTE {SCAN_READY_STMT} USING @jf_queue, @jf_limit"
        ),
    })
}

/// The result sets of [`light_text`], checked: the `SET`'s (empty), then
/// `expected` more.
fn light_sets(
    mut sets: Vec<Vec<MySqlRow>>,
    expected: usize,
) -> Result<Vec<Vec<MySqlRow>>, CoordinatorError> {
    // The SET answers with no rows: an empty first set.
    if sets.len() != expected + 1 || !sets[0].is_empty() {
        return Err(CoordinatorError::Internal(format!(
            "a light claim's reads gave {} result sets ({} expected, the first empty)",
            sets.len(),
            expected + 1
        )));
    }
    sets.remove(0);
    Ok(sets)
}

/// [`scan`] of a queue believed to have no provider, from its queue row
/// and ready scan (`sets`, after the `SET`'s, see [`light_text`]): the
/// row also says whether any of its leases ran out, and the expired-lease
/// scan (`scan_expired`) is sent, in a round trip of its own, only then.
async fn finish_light(
    store: &JobStore,
    conn: &mut MySqlConnection,
    sets: Vec<Vec<MySqlRow>>,
    scan_expired: String,
) -> Result<Option<Scan>, CoordinatorError> {
    let mut sets = light_sets(sets, 2)?;
    let ready = locked_jobs(&sets.pop().unwrap_or_default())?;
    let Some((rules, any_expired)) = Rules::from_queue_row(&sets[0])? else {
        return Ok(None);
    };
    // A paused queue hands out nothing: no expired lease to lock either.
    let expired = match any_expired && !rules.queue_paused {
        true => {
            store.pause(PausePoint::ClaimBetweenScans).await;
            let mut sets = batch::result_sets(conn, &scan_expired).await?;
            locked_jobs(&sets.pop().unwrap_or_default())?
        }
        false => Vec::new(),
    };
    Ok(Some(Scan {
        rules,
        expired,
        ready,
    }))
}

/// A handoff's first round trip when its claim is light and it writes one
/// job (a lone worker's Complete or Fail that asks for its next job): the
/// lock of the written job `job_id`, then the light claim's reads, in one
/// round trip instead of two. The job is locked first, as when the two
/// are sent apart, so the lock order is the same. Its lock (absent when
/// the job does not exist), and the light scan of `queue` (`None`: the
/// queue's row names a provider, scan again with the full rules), the
/// written job left out of the expired-lease scan.
pub(super) async fn lock_and_scan_light(
    store: &JobStore,
    conn: &mut MySqlConnection,
    job_id: u64,
    queue: &str,
    limit: u32,
) -> Result<(HashMap<u64, LockedJob>, Option<Scan>), CoordinatorError> {
    let text = light_text(queue, limit, Some(job_id))?;
    let mut sets = light_reads(conn, &text).await?;
    if sets.len() != 4 {
        return Err(CoordinatorError::Internal(format!(
            "a handoff's lock and light reads gave {} result sets (4 expected)",
            sets.len()
        )));
    }
    let locked = sets
        .remove(1)
        .iter()
        .map(|row| batch::locked_job(row).map(|l| (l.job.id, l)))
        .collect::<Result<HashMap<_, _>, _>>()?;
    let scan_expired = fill(&SCAN_EXPIRED, queue, limit, false, &[job_id])?;
    let scan = finish_light(store, conn, sets, scan_expired).await?;
    Ok((locked, scan))
}

fn locked_jobs(rows: &[MySqlRow]) -> Result<Vec<LockedJob>, CoordinatorError> {
    rows.iter().map(batch::locked_job).collect()
}
