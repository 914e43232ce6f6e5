//! The statements every batched transaction shares: lock jobs by id, write
//! their new images fenced row by row, append events, find replays.
//!
//! A batch's rows travel as one JSON array bound to one parameter and are
//! read back with `JSON_TABLE` (MySQL 8.0 and MariaDB 10.6 alike), so each
//! statement is one prepared statement whatever the batch size, and one
//! round trip for the whole batch.

use super::convert_sqlx_err;
use super::reads::{elapsed, LockedJob};
use super::rows::{self, JOB_COLUMNS};
use crate::domain::policy::DispatchFacts;
use crate::domain::{CoordinatorError, DbTime, Job};
use serde::Serialize;
use sqlx::MySqlConnection;
use std::collections::HashMap;
use std::sync::LazyLock;

/// `sql` with `{job_columns}` replaced by [`JOB_COLUMNS`].
pub(crate) fn with_job_columns(sql: &str) -> String {
    sql.replace("{job_columns}", JOB_COLUMNS)
}

static LOCK_JOBS: LazyLock<String> =
    LazyLock::new(|| with_job_columns(include_str!("queries/batch/lock_jobs.sql")));

/// A DB timestamp as `JSON_TABLE` reads a `DATETIME(6)`.
pub(crate) fn db_time<S: serde::Serializer>(t: &DbTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&t.format("%Y-%m-%d %H:%M:%S%.6f"))
}

pub(crate) fn opt_db_time<S: serde::Serializer>(
    t: &Option<DbTime>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => db_time(t, s),
        None => s.serialize_none(),
    }
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
pub(crate) fn json<T: Serialize>(rows: &[T]) -> Result<String, CoordinatorError> {
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
        has_observations: rows::get::<i64>(row, "has_observations")? != 0,
        now: rows::get(row, "now")?,
        job,
    })
}

/// `SELECT … FOR UPDATE` of the jobs `ids` (sorted ascending here, so every
/// batch locks in the same order). Jobs that do not exist are absent.
pub(crate) async fn lock_jobs(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<HashMap<u64, LockedJob>, CoordinatorError> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let found = sqlx::query(&LOCK_JOBS)
        .bind(json(&sorted)?)
        .fetch_all(conn)
        .await
        .map_err(convert_sqlx_err)?;
    found
        .iter()
        .map(|row| locked_job(row).map(|l| (l.job.id, l)))
        .collect()
}

/// The database clock, read again (see `writeback`: a batch that waited
/// long for its locks must not stamp its changes with the time it started).
pub(crate) async fn db_now(conn: &mut MySqlConnection) -> Result<DbTime, CoordinatorError> {
    let row = sqlx::query("SELECT UTC_TIMESTAMP(6) AS now")
        .fetch_one(conn)
        .await
        .map_err(convert_sqlx_err)?;
    rows::get(&row, "now")
}

/// The new image of one job, fenced on what it was computed from.
#[derive(Debug, Serialize)]
struct Image<'a> {
    id: u64,
    fence_state: &'static str,
    fence_attempt: u64,
    state: &'static str,
    attempt: u64,
    next_action: &'static str,
    #[serde(serialize_with = "db_time")]
    run_at: DbTime,
    #[serde(serialize_with = "opt_db_time")]
    lease_until: Option<DbTime>,
    lease_owner: Option<&'a str>,
    #[serde(serialize_with = "opt_db_time")]
    first_dispatched_at: Option<DbTime>,
    dispatch_count: u32,
    provider_reference: Option<&'a str>,
    result: Option<&'a str>,
    last_error: Option<&'a str>,
    state_reason: Option<&'a str>,
    #[serde(serialize_with = "db_time")]
    updated_at: DbTime,
    #[serde(serialize_with = "opt_db_time")]
    finished_at: Option<DbTime>,
}

/// One row's change: the row as locked (its state and attempt are the
/// fence) and the row as it must be afterwards.
pub(crate) struct Change<'a> {
    pub before: &'a Job,
    pub after: &'a Job,
}

/// Writes every change in one UPDATE, fenced row by row. Every row must
/// match: the caller holds their locks, so a row that did not is a bug or
/// a schema the code does not know, reported as a conflict (the
/// transaction is then rolled back and run again from the start).
pub(crate) async fn write_images(
    conn: &mut MySqlConnection,
    changes: &[Change<'_>],
) -> Result<(), CoordinatorError> {
    if changes.is_empty() {
        return Ok(());
    }
    let mut images: Vec<Image> = changes
        .iter()
        .map(|c| {
            let a = c.after;
            debug_assert_eq!(c.before.id, a.id);
            debug_assert!(a.attempt == c.before.attempt || a.attempt == c.before.attempt + 1);
            Image {
                id: a.id,
                fence_state: c.before.state.as_str(),
                fence_attempt: c.before.attempt,
                state: a.state.as_str(),
                attempt: a.attempt,
                next_action: a.next_action.as_str(),
                run_at: a.run_at,
                lease_until: a.lease_until,
                lease_owner: a.lease_owner.as_deref(),
                first_dispatched_at: a.first_dispatched_at,
                dispatch_count: a.dispatch_count,
                provider_reference: a.provider_reference.as_deref(),
                result: a.result.as_deref(),
                last_error: a.last_error.as_deref(),
                state_reason: a.state_reason.as_deref(),
                updated_at: a.updated_at,
                finished_at: a.finished_at,
            }
        })
        .collect();
    images.sort_unstable_by_key(|i| i.id);
    let done = sqlx::query(include_str!("queries/batch/write_images.sql"))
        .bind(json(&images)?)
        .execute(conn)
        .await
        .map_err(convert_sqlx_err)?;
    if done.rows_affected() != images.len() as u64 {
        return Err(CoordinatorError::TransactionConflict(format!(
            "{} of {} fenced rows changed under their row locks",
            images.len() as u64 - done.rows_affected().min(images.len() as u64),
            images.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_time_encode_as_sql_reads_them() {
        assert_eq!(hex(&[0x00, 0xab, 0xff]), "00abff");
        let t =
            DbTime::parse_from_str("2026-11-30 20:31:21.000042", "%Y-%m-%d %H:%M:%S%.f").unwrap();
        #[derive(Serialize)]
        struct T(#[serde(serialize_with = "db_time")] DbTime);
        assert_eq!(
            serde_json::to_string(&T(t)).unwrap(),
            "\"2026-11-30 20:31:21.000042\""
        );
    }
}
