//! Decoding rows of `jobs` and `job_observations` into domain types.
//!
//! Text columns use binary (`_bin`) collations so keys compare byte for
//! byte; MySQL flags such columns BINARY, which sqlx will not decode as
//! `String`, so they are read as bytes and checked as UTF-8 here.

use jobfence_domain::{CoordinatorError, DbTime, Job, Observation};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

/// The columns [`job`] reads, in a SELECT list.
pub(crate) const JOB_COLUMNS: &str = "id, queue, operation_key, payload, state, attempt, \
    next_action, run_at, lease_until, lease_owner, first_dispatched_at, dispatch_count, \
    provider_reference, result, last_error, state_reason, created_at, updated_at, finished_at";

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
        run_at: get::<DbTime>(row, "run_at")?,
        lease_until: get(row, "lease_until")?,
        lease_owner: opt_text(row, "lease_owner")?,
        first_dispatched_at: get(row, "first_dispatched_at")?,
        dispatch_count: get(row, "dispatch_count")?,
        provider_reference: opt_text(row, "provider_reference")?,
        result: opt_text(row, "result")?,
        last_error: opt_text(row, "last_error")?,
        state_reason: opt_text(row, "state_reason")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
        finished_at: get(row, "finished_at")?,
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
        recorded_at: get(row, "recorded_at")?,
    })
}
