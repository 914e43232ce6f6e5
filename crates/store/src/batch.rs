//! The statements every batched transaction shares: lock jobs by id, and
//! write their new images fenced row by row, each one statement (one round
//! trip) for the whole batch.
//!
//! A statement's placeholder list grows with the batch; sizes are padded
//! to a few shapes (1 to 8, then powers of two) by repeating a row, so each
//! connection prepares a handful of statements, not one per batch size.
//! Where padding cannot work (inserts) and batches are large, the rows
//! travel as one JSON array read back with `JSON_TABLE` (MySQL 8.0 and
//! MariaDB 10.6 alike).

use super::convert_sqlx_err;
use super::literal;
use super::reads::{elapsed, LockedJob};
use super::rows::{self, JOB_COLUMNS, LOCKED_JOB_COLUMNS};
use jobfence_domain::policy::DispatchFacts;
use jobfence_domain::{CoordinatorError, DbTime, Job};
use sqlx::MySqlConnection;
use std::collections::HashMap;
use std::sync::LazyLock;

/// `sql` with `{locked_job_columns}` replaced by [`LOCKED_JOB_COLUMNS`]
/// and `{job_columns}` by [`JOB_COLUMNS`].
pub(crate) fn with_job_columns(sql: &str) -> String {
    sql.replace("{locked_job_columns}", LOCKED_JOB_COLUMNS)
        .replace("{job_columns}", JOB_COLUMNS)
}

/// The padded size of a batch of `n` rows: `n` up to 8, then the next
/// power of two.
pub(crate) fn shape(n: usize) -> usize {
    if n <= 8 {
        n.max(1)
    } else {
        n.next_power_of_two()
    }
}

/// `template` with `{marker}` replaced by `per_row` repeated `n` times
/// (joined by `sep`), memoised per (template, n).
pub(crate) fn expand(
    template: &'static str,
    markers: &[(&'static str, &'static str, &'static str)],
    n: usize,
) -> std::sync::Arc<str> {
    type Key = (usize, usize);
    static CACHE: LazyLock<std::sync::Mutex<HashMap<Key, std::sync::Arc<str>>>> =
        LazyLock::new(Default::default);
    let key = (template.as_ptr() as usize, n);
    if let Some(sql) = CACHE.lock().expect("sql cache poisoned").get(&key) {
        return sql.clone();
    }
    let mut sql = with_job_columns(template);
    for (marker, per_row, sep) in markers {
        sql = sql.replace(marker, &vec![*per_row; n].join(sep));
    }
    let sql: std::sync::Arc<str> = sql.into();
    CACHE
        .lock()
        .expect("sql cache poisoned")
        .insert(key, sql.clone());
    sql
}

/// A DB timestamp as `JSON_TABLE` reads a `DATETIME(6)`.
pub(crate) fn db_time<S: serde::Serializer>(t: &DbTime, s: S) -> Result<S::Ok, S::Error> {
    let mut text = String::with_capacity(26);
    literal::push_time(&mut text, t);
    s.serialize_str(&text)
}

/// Lower-case hex, for binary values (`UNHEX` in SQL).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// The rows as one JSON array.
pub(crate) fn json<T: serde::Serialize>(rows: &[T]) -> Result<String, CoordinatorError> {
    serde_json::to_string(rows)
        .map_err(|e| CoordinatorError::Internal(format!("cannot encode a batch: {e}")))
}

/// A job read under its row lock, with the DB-clock facts decisions need.
pub(crate) fn locked_job(row: &sqlx::mysql::MySqlRow) -> Result<LockedJob, CoordinatorError> {
    let job = rows::job(row)?;
    Ok(LockedJob {
        dispatch: DispatchFacts {
            since_first_dispatch: elapsed(rows::get(row, "since_first_dispatch_us")?),
            dispatch_count: job.dispatch_count,
        },
        lease_expired: rows::get::<Option<i64>>(row, "lease_expired")?.unwrap_or(0) != 0,
        // While an older coordinator may record observations without the
        // flag (fleet.rs), every job counts as having some.
        has_observations: rows::get::<i64>(row, "has_observations")? != 0
            || !crate::fleet::observations_flag_complete(),
        now: rows::time(row, "now")?,
        job,
    })
}

/// `SELECT … FOR UPDATE` of the jobs `ids` (ascending primary-key order,
/// so every batch locks in the same order). Jobs that do not exist are
/// absent.
pub(crate) async fn lock_jobs(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<HashMap<u64, LockedJob>, CoordinatorError> {
    let Some(&first) = ids.first() else {
        return Ok(HashMap::new());
    };
    let n = shape(ids.len());
    let sql = expand(
        include_str!("queries/batch/lock_jobs.sql"),
        &[("{ids}", "?", ", ")],
        n,
    );
    let mut query = sqlx::query(&sql);
    for i in 0..n {
        query = query.bind(ids.get(i).copied().unwrap_or(first));
    }
    let found = query.fetch_all(conn).await.map_err(convert_sqlx_err)?;
    found
        .iter()
        .map(|row| locked_job(row).map(|l| (l.job.id, l)))
        .collect()
}

/// Runs `text` (several statements, literals only: see `literal`) in one
/// round trip and returns the rows of each statement, in order (an empty
/// list for a statement that returns none, or no rows at all).
pub(crate) async fn result_sets(
    conn: &mut MySqlConnection,
    text: &str,
) -> Result<Vec<Vec<sqlx::mysql::MySqlRow>>, CoordinatorError> {
    result_sets_raw(conn, text).await.map_err(convert_sqlx_err)
}

/// [`result_sets`] with the server's error as it came (for a caller that
/// acts on one error number itself).
pub(crate) async fn result_sets_raw(
    conn: &mut MySqlConnection,
    text: &str,
) -> Result<Vec<Vec<sqlx::mysql::MySqlRow>>, sqlx::Error> {
    use tokio_stream::StreamExt;
    let mut sets = vec![Vec::new()];
    let mut results = sqlx::raw_sql(text).fetch_many(conn);
    while let Some(item) = results.next().await {
        match item? {
            sqlx::Either::Left(_) => sets.push(Vec::new()),
            sqlx::Either::Right(row) => sets.last_mut().expect("a set").push(row),
        }
    }
    // Every statement ends with its summary: the last set is empty.
    sets.pop();
    Ok(sets)
}

/// The database clock, read again (see `writeback`: a batch that waited
/// long for its locks must not stamp its changes with the time it started).
pub(crate) async fn db_now(conn: &mut MySqlConnection) -> Result<DbTime, CoordinatorError> {
    let row = sqlx::query(include_str!("queries/batch/db_now.sql"))
        .fetch_one(conn)
        .await
        .map_err(convert_sqlx_err)?;
    rows::get(&row, "now")
}

/// One row's change: the row as locked (its state and attempt are the
/// fence) and the row as it must be afterwards.
pub(crate) struct Change<'a> {
    pub before: &'a Job,
    pub after: &'a Job,
}

/// Checks that every change keeps its row's id and moves its attempt by
/// at most one (a hand-out adds one; every other write keeps it: docs/design.md
/// rule 3). A change that does not is a bug in the caller's plan, refused
/// `Internal` before anything is written, in release builds too.
pub(crate) fn check_images(changes: &[Change<'_>]) -> Result<(), CoordinatorError> {
    for c in changes {
        let (b, a) = (c.before, c.after);
        if b.id != a.id {
            return Err(CoordinatorError::Internal(format!(
                "a fenced write planned job {}'s row as job {}'s",
                b.id, a.id
            )));
        }
        if a.attempt != b.attempt && a.attempt != b.attempt + 1 {
            return Err(CoordinatorError::Internal(format!(
                "a fenced write planned job {} from attempt {} to {}",
                b.id, b.attempt, a.attempt
            )));
        }
    }
    Ok(())
}

/// Writes every change in one UPDATE, fenced row by row. Every row must
/// match: the caller holds their locks, so a row that did not is a bug or
/// a schema the code does not know, reported as a conflict (the
/// transaction is then rolled back and run again from the start).
pub(crate) async fn write_images(
    conn: &mut MySqlConnection,
    changes: &[Change<'_>],
) -> Result<(), CoordinatorError> {
    let Some(first) = changes.first() else {
        return Ok(());
    };
    check_images(changes)?;
    let n = shape(changes.len());
    let sql = expand(
        include_str!("queries/batch/write_images.sql"),
        &[
            ("{cases}", "WHEN ? THEN ?", " "),
            ("{ids}", "?", ", "),
            ("{fences}", "(?, ?, ?)", ", "),
        ],
        n,
    );
    // Padding repeats the first row: the same id with the same value, and
    // the same fence, which the server matches once.
    let row = |i: usize| changes.get(i).unwrap_or(first);
    let mut q = sqlx::query(&sql);
    macro_rules! column {
        ($value:expr) => {
            for i in 0..n {
                let a = row(i).after;
                q = q.bind(a.id).bind($value(a));
            }
        };
    }
    column!(|a: &Job| a.state.as_str());
    column!(|a: &Job| a.attempt);
    column!(|a: &Job| a.next_action.as_str());
    column!(|a: &Job| a.run_at);
    column!(|a: &Job| a.lease_until);
    column!(|a: &Job| a.lease_owner.clone());
    column!(|a: &Job| a.first_dispatched_at);
    column!(|a: &Job| a.dispatch_count);
    column!(|a: &Job| a.provider_reference.clone());
    column!(|a: &Job| a.result.clone());
    column!(|a: &Job| a.last_error.clone());
    column!(|a: &Job| a.state_reason.clone());
    column!(|a: &Job| a.updated_at);
    column!(|a: &Job| a.finished_at);
    for i in 0..n {
        q = q.bind(row(i).before.id);
    }
    for i in 0..n {
        let b = row(i).before;
        q = q.bind(b.id).bind(b.state.as_str()).bind(b.attempt);
    }
    let done = q.execute(conn).await.map_err(convert_sqlx_err)?;
    if done.rows_affected() != changes.len() as u64 {
        return Err(CoordinatorError::TransactionConflict(format!(
            "{} of {} fenced rows changed under their row locks",
            (changes.len() as u64).saturating_sub(done.rows_affected()),
            changes.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, attempt: u64) -> Job {
        let t = DbTime::parse_from_str("2026-01-01 00:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
        Job {
            id,
            queue: "refunds".into(),
            operation_key: "refund-1".into(),
            payload: "{}".into(),
            state: jobfence_domain::JobState::Running,
            attempt,
            next_action: jobfence_domain::NextAction::Execute,
            run_at: t,
            lease_until: Some(t),
            lease_owner: None,
            first_dispatched_at: None,
            dispatch_count: 0,
            provider_reference: None,
            result: None,
            last_error: None,
            state_reason: None,
            created_at: t,
            updated_at: t,
            finished_at: None,
            priority: Default::default(),
            fairness_key: Default::default(),
        }
    }

    #[test]
    fn a_change_that_moves_an_id_or_skips_an_attempt_is_refused() {
        let before = job(7, 3);
        let renewed = job(7, 3);
        let handed_out = job(7, 4);
        let skipped = job(7, 5);
        let other = job(8, 3);
        let ok = |after| {
            check_images(&[Change {
                before: &before,
                after,
            }])
        };
        assert!(ok(&renewed).is_ok());
        assert!(ok(&handed_out).is_ok());
        assert!(matches!(ok(&skipped), Err(CoordinatorError::Internal(_))));
        assert!(matches!(ok(&other), Err(CoordinatorError::Internal(_))));
    }

    #[test]
    fn hex_and_time_encode_as_sql_reads_them() {
        assert_eq!(hex(&[0x00, 0xab, 0xff]), "00abff");
        let t =
            DbTime::parse_from_str("2026-11-30 20:31:21.000042", "%Y-%m-%d %H:%M:%S%.f").unwrap();
        #[derive(serde::Serialize)]
        struct T(#[serde(serialize_with = "db_time")] DbTime);
        assert_eq!(
            serde_json::to_string(&T(t)).unwrap(),
            "\"2026-11-30 20:31:21.000042\""
        );
    }
}
