//! The pruner's optional archive, seen from the store: the rows one
//! pruning batch removes, read inside its transaction after the
//! `FOR UPDATE` lock (so what is archived is exactly what is deleted), as
//! one JSON object per job, handed to a [`PruneArchive`] that must make
//! them durable before the batch commits. The store does no file I/O:
//! the writer (a gzip'd JSON-lines file) is `jobfence_core::archive`.
//!
//! One line: `{"job": {…}, "observations": [{…}, …], "events": [{…}, …]}`
//! with every column of the `jobs`, `job_observations` and `job_events`
//! rows under its column name; integers as JSON numbers, `DATETIME`s as
//! RFC 3339 UTC strings with microseconds (`2026-12-01T20:57:31.123456Z`),
//! binary columns (the SHA-256 digests) as lowercase hex, NULL as `null`;
//! observations and events in id order.

use super::convert_sqlx_err;
use jobfence_domain::{CoordinatorError, DbTime};
use serde_json::{Map, Value};
use sqlx::mysql::MySqlRow;
use sqlx::{Column, Row, TypeInfo};
use std::collections::HashSet;

/// Where a pruning batch's rows go before the batch commits.
pub trait PruneArchive: Send + Sync {
    /// Appends these lines (one serialized JSON object each, without the
    /// newline) and makes them durable (flushed and fsynced) before
    /// returning: the batch commits only after `Ok`. Returns the bytes the
    /// archive grew by on disk. An `Err` (why, naming the file) rolls the
    /// batch back and stops the run.
    fn write_batch(&self, lines: &[Vec<u8>]) -> Result<u64, String>;
}

/// What one batch archived: its lines and the row counts in them.
pub(crate) struct ArchivedRows {
    pub(crate) lines: Vec<Vec<u8>>,
    pub(crate) observations: u64,
    pub(crate) events: u64,
}

/// Reads the rows of jobs `ids` (a comma-separated id list, already
/// locked `FOR UPDATE` in `tx`), their observations and their events
/// (locking reads too: they see exactly what the DELETEs will), one line
/// per job in id order.
pub(crate) async fn read_rows(
    tx: &mut sqlx::MySqlConnection,
    ids: &str,
) -> Result<ArchivedRows, CoordinatorError> {
    let read = |sql: &str| sql.replace("{ids}", ids);
    let binary: Vec<(String, String)> =
        sqlx::query_as(include_str!("queries/archive/binary_columns.sql"))
            .fetch_all(&mut *tx)
            .await
            .map_err(convert_sqlx_err)?;
    let binary: HashSet<(String, String)> = binary.into_iter().collect();
    let jobs = sqlx::query(&read(include_str!("queries/archive/jobs.sql")))
        .fetch_all(&mut *tx)
        .await
        .map_err(convert_sqlx_err)?;
    let observations = sqlx::query(&read(include_str!("queries/archive/observations.sql")))
        .fetch_all(&mut *tx)
        .await
        .map_err(convert_sqlx_err)?;
    let events = sqlx::query(&read(include_str!("queries/archive/events.sql")))
        .fetch_all(&mut *tx)
        .await
        .map_err(convert_sqlx_err)?;
    let counts = (observations.len() as u64, events.len() as u64);
    let mut observations = grouped(observations, "job_observations", &binary)?
        .into_iter()
        .peekable();
    let mut events = grouped(events, "job_events", &binary)?
        .into_iter()
        .peekable();
    let mut lines = Vec::with_capacity(jobs.len());
    for row in &jobs {
        let job = object(row, "jobs", &binary)?;
        let id = job.get("id").and_then(Value::as_u64).unwrap_or(0);
        let take = |it: &mut std::iter::Peekable<std::vec::IntoIter<(u64, Value)>>| {
            let mut rows = Vec::new();
            while let Some((_, row)) = it.next_if(|(job_id, _)| *job_id == id) {
                rows.push(row);
            }
            Value::Array(rows)
        };
        let mut line = Map::new();
        line.insert("job".into(), Value::Object(job));
        line.insert("observations".into(), take(&mut observations));
        line.insert("events".into(), take(&mut events));
        lines.push(
            serde_json::to_vec(&Value::Object(line))
                .map_err(|e| CoordinatorError::Internal(format!("archiving a job: {e}")))?,
        );
    }
    Ok(ArchivedRows {
        lines,
        observations: counts.0,
        events: counts.1,
    })
}

/// Rows as objects with their `job_id`, in the order read.
fn grouped(
    rows: Vec<MySqlRow>,
    table: &str,
    binary: &HashSet<(String, String)>,
) -> Result<Vec<(u64, Value)>, CoordinatorError> {
    rows.iter()
        .map(|row| {
            let o = object(row, table, binary)?;
            let job_id = o.get("job_id").and_then(Value::as_u64).unwrap_or(0);
            Ok((job_id, Value::Object(o)))
        })
        .collect()
}

/// Every column of `row` (of `table`) under its name (see the module docs
/// for the encoding; `binary` names the byte columns). A value this cannot
/// read is an error, never a column silently left out.
fn object(
    row: &MySqlRow,
    table: &str,
    binary: &HashSet<(String, String)>,
) -> Result<Map<String, Value>, CoordinatorError> {
    let mut o = Map::new();
    for (i, column) in row.columns().iter().enumerate() {
        let ty = column.type_info().name().to_ascii_uppercase();
        let fail = |e: sqlx::Error| {
            CoordinatorError::Internal(format!("archiving column {} ({ty}): {e}", column.name()))
        };
        let value = if ty.contains("INT") {
            if ty.contains("UNSIGNED") {
                row.try_get::<Option<u64>, _>(i)
                    .map_err(fail)?
                    .map(Value::from)
            } else {
                row.try_get::<Option<i64>, _>(i)
                    .map_err(fail)?
                    .map(Value::from)
            }
        } else if ty == "DATETIME" || ty == "TIMESTAMP" {
            row.try_get::<Option<DbTime>, _>(i)
                .map_err(fail)?
                .map(|t| Value::from(t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()))
        } else if binary.contains(&(table.to_string(), column.name().to_string())) {
            row.try_get::<Option<Vec<u8>>, _>(i)
                .map_err(fail)?
                .map(|b| Value::from(hex(&b)))
        } else if ty == "DOUBLE" || ty == "FLOAT" {
            row.try_get::<Option<f64>, _>(i)
                .map_err(fail)?
                .map(Value::from)
        } else {
            // Text, also when its `_bin` collation makes the driver call
            // it binary.
            match row.try_get::<Option<Vec<u8>>, _>(i).map_err(fail)? {
                Some(b) => Some(Value::from(String::from_utf8(b).map_err(|e| {
                    CoordinatorError::Internal(format!(
                        "archiving column {}: not UTF-8: {e}",
                        column.name()
                    ))
                })?)),
                None => None,
            }
        };
        o.insert(column.name().to_string(), value.unwrap_or(Value::Null));
    }
    Ok(o)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
