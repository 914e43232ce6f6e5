//! Decoding rows of `jobs` and `job_observations` into domain types.
//!
//! Text columns use binary (`_bin`) collations so keys compare byte for
//! byte; MySQL flags such columns BINARY, which sqlx will not decode as
//! `String`, so they are read as bytes and checked as UTF-8 here.

use jobfence_domain::fairness::Priority;
use jobfence_domain::{CoordinatorError, DbTime, Job, Observation};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

/// The column list of [`JOB_COLUMNS`], as a literal for `concat!`.
macro_rules! job_columns {
    () => {
        "id, queue, operation_key, payload, state, attempt, next_action, run_at, lease_until, \
         lease_owner, first_dispatched_at, dispatch_count, provider_reference, result, \
         last_error, state_reason, created_at, updated_at, finished_at, priority, fairness_key"
    };
}

/// The columns [`job`] reads, in a SELECT list.
pub(crate) const JOB_COLUMNS: &str = job_columns!();

/// The columns `batch::locked_job` reads of a row its caller locked: the
/// job's, and the DB-clock facts its decisions need (`{locked_job_columns}`
/// in a query file).
pub(crate) const LOCKED_JOB_COLUMNS: &str = concat!(
    job_columns!(),
    ", CAST(TIMESTAMPDIFF(MICROSECOND, first_dispatched_at, UTC_TIMESTAMP(6)) AS SIGNED) \
     AS since_first_dispatch_us, \
     CAST(lease_until <= UTC_TIMESTAMP(6) AS SIGNED) AS lease_expired, \
     has_observations, UTC_TIMESTAMP(6) AS now"
);

/// The columns [`observation`] reads, in a SELECT list.
pub(crate) const OBSERVATION_COLUMNS: &str =
    "id, job_id, attempt, source, outcome, provider_reference, body, dedup_key, recorded_at";

fn decode_err(column: &str, e: impl std::fmt::Display) -> CoordinatorError {
    CoordinatorError::Internal(format!("cannot decode column {column}: {e}"))
}

pub(crate) fn get<'r, T>(row: &'r MySqlRow, column: &str) -> Result<T, CoordinatorError>
where
    T: sqlx::Decode<'r, sqlx::MySql> + sqlx::Type<sqlx::MySql>,
{
    row.try_get(column).map_err(|e| decode_err(column, e))
}

pub(crate) fn opt_text(row: &MySqlRow, column: &str) -> Result<Option<String>, CoordinatorError> {
    let bytes: Option<Vec<u8>> = get(row, column)?;
    bytes
        .map(|b| String::from_utf8(b).map_err(|e| decode_err(column, e)))
        .transpose()
}

pub(crate) fn text(row: &MySqlRow, column: &str) -> Result<String, CoordinatorError> {
    opt_text(row, column)?.ok_or_else(|| decode_err(column, "unexpected NULL"))
}

/// A `DATETIME` column, `NULL` as `None`. A value in the text protocol
/// (what raw statements and `EXECUTE` answer: `YYYY-MM-DD
/// HH:MM:SS[.ffffff]`) is read field by field; sqlx's decoder parses a
/// strftime pattern for it at every call, about 2 % of the coordinator's
/// CPU at 64 workers (docs/benchmarks.md). A binary-protocol value (a
/// length byte and at most 11 more) goes to sqlx's decoder.
pub(crate) fn opt_time(row: &MySqlRow, column: &str) -> Result<Option<DbTime>, CoordinatorError> {
    use sqlx::ValueRef as _;
    let raw = row.try_get_raw(column).map_err(|e| decode_err(column, e))?;
    if raw.is_null() {
        return Ok(None);
    }
    let bytes =
        <&[u8] as sqlx::Decode<sqlx::MySql>>::decode(raw).map_err(|e| decode_err(column, e))?;
    if bytes.len() < 19 || bytes[4] != b'-' {
        return get(row, column);
    }
    text_time(bytes).map(Some).ok_or_else(|| {
        decode_err(
            column,
            format!("not a DATETIME: {:?}", String::from_utf8_lossy(bytes)),
        )
    })
}

/// A `DATETIME` column that is never `NULL` (see [`opt_time`]).
pub(crate) fn time(row: &MySqlRow, column: &str) -> Result<DbTime, CoordinatorError> {
    opt_time(row, column)?.ok_or_else(|| decode_err(column, "unexpected NULL"))
}

/// `YYYY-MM-DD HH:MM:SS`, then optionally `.` and 1–6 digits of a second.
fn text_time(b: &[u8]) -> Option<DbTime> {
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let digits = b.get(r)?;
        digits.iter().try_fold(0u32, |n, d| {
            d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
        })
    };
    let seps = [(4, b'-'), (7, b'-'), (10, b' '), (13, b':'), (16, b':')];
    if seps.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    let micros = match b.len() {
        19 => 0,
        21..=26 if b[19] == b'.' => num(20..b.len())? * 10u32.pow(26 - b.len() as u32),
        _ => return None,
    };
    let date = chrono::NaiveDate::from_ymd_opt(num(0..4)? as i32, num(5..7)?, num(8..10)?)?;
    let time =
        chrono::NaiveTime::from_hms_micro_opt(num(11..13)?, num(14..16)?, num(17..19)?, micros)?;
    Some(DbTime::new(date, time))
}

fn parsed<T>(row: &MySqlRow, column: &str) -> Result<T, CoordinatorError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    text(row, column)?
        .parse()
        .map_err(|e| decode_err(column, e))
}

/// Decodes a row selected with [`JOB_COLUMNS`].
pub(crate) fn job(row: &MySqlRow) -> Result<Job, CoordinatorError> {
    Ok(Job {
        id: get(row, "id")?,
        queue: text(row, "queue")?,
        operation_key: text(row, "operation_key")?,
        payload: text(row, "payload")?,
        state: parsed(row, "state")?,
        attempt: get(row, "attempt")?,
        next_action: parsed(row, "next_action")?,
        run_at: time(row, "run_at")?,
        lease_until: opt_time(row, "lease_until")?,
        lease_owner: opt_text(row, "lease_owner")?,
        first_dispatched_at: opt_time(row, "first_dispatched_at")?,
        dispatch_count: get(row, "dispatch_count")?,
        provider_reference: opt_text(row, "provider_reference")?,
        result: opt_text(row, "result")?,
        last_error: opt_text(row, "last_error")?,
        state_reason: opt_text(row, "state_reason")?,
        created_at: time(row, "created_at")?,
        updated_at: time(row, "updated_at")?,
        finished_at: opt_time(row, "finished_at")?,
        priority: Priority::stored(get(row, "priority")?),
        fairness_key: Some(text(row, "fairness_key")?).filter(|k| !k.is_empty()),
    })
}

/// Decodes a row selected with [`OBSERVATION_COLUMNS`].
pub(crate) fn observation(row: &MySqlRow) -> Result<Observation, CoordinatorError> {
    Ok(Observation {
        id: get(row, "id")?,
        job_id: get(row, "job_id")?,
        attempt: get(row, "attempt")?,
        source: parsed(row, "source")?,
        outcome: parsed(row, "outcome")?,
        provider_reference: opt_text(row, "provider_reference")?,
        body: text(row, "body")?,
        dedup_key: text(row, "dedup_key")?,
        recorded_at: time(row, "recorded_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::text_time;
    use jobfence_domain::DbTime;

    fn chrono_parse(s: &str) -> Option<DbTime> {
        DbTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").ok()
    }

    #[test]
    fn a_text_datetime_reads_as_sqlx_reads_it() {
        for s in [
            "2026-12-03 17:04:05",
            "2026-12-03 17:04:05.123456",
            "2026-12-03 17:04:05.1",
            "2026-12-03 17:04:05.000010",
            "1970-01-01 00:00:00.000000",
            "9999-12-31 23:59:59.999999",
            "2024-02-29 12:00:00.5",
        ] {
            assert_eq!(text_time(s.as_bytes()), chrono_parse(s), "{s}");
            assert!(text_time(s.as_bytes()).is_some(), "{s}");
        }
    }

    #[test]
    fn a_malformed_text_datetime_is_refused() {
        for s in [
            "2026-12-03T17:04:05",
            "2026-13-03 17:04:05",
            "2023-02-29 17:04:05",
            "2026-12-03 24:04:05",
            "2026-12-03 17:04:05.",
            "2026-12-03 17:04:05.1234567",
            "2026-12-03 17:04:05,123",
            "2026-12-03 17:0a:05",
            "2026-12-03 17:04:05 ",
        ] {
            assert_eq!(text_time(s.as_bytes()), None, "{s}");
        }
    }
}
