//! The `job_events` log: every transition and every rejected stale write,
//! written in the transaction of the change. Applied fenced calls carry a
//! digest of the request, which is how an exact replay is recognised.

use super::batch::{db_time, expand, hex, json};
use super::literal;
use super::tx::Tx;
use super::{convert_sqlx_err, rows};
use jobfence_domain::{CoordinatorError, DbTime, EventKind, Job, JobState};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::MySqlConnection;
use std::collections::HashMap;
use std::sync::LazyLock;

/// One entry to append.
#[derive(Debug, Serialize)]
pub(crate) struct NewEvent<'a> {
    pub job_id: u64,
    pub queue: &'a str,
    /// The attempt that caused it (for a rejection, the one presented).
    pub attempt: u64,
    #[serde(serialize_with = "kind")]
    pub kind: EventKind,
    #[serde(serialize_with = "opt_state")]
    pub from_state: Option<JobState>,
    #[serde(serialize_with = "opt_state")]
    pub to_state: Option<JobState>,
    /// The job's attempt after the change.
    pub current_attempt: u64,
    /// Set for applied fenced calls only (sent as hex).
    #[serde(serialize_with = "opt_digest")]
    pub request_digest: Option<[u8; 32]>,
    pub detail: Option<String>,
    /// The DB clock read in the transaction (the change's `now`).
    #[serde(serialize_with = "db_time")]
    pub created_at: DbTime,
}

fn kind<S: serde::Serializer>(k: &EventKind, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(k.as_str())
}

fn opt_state<S: serde::Serializer>(s: &Option<JobState>, ser: S) -> Result<S::Ok, S::Error> {
    match s {
        Some(s) => ser.serialize_str(s.as_str()),
        None => ser.serialize_none(),
    }
}

fn opt_digest<S: serde::Serializer>(d: &Option<[u8; 32]>, ser: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser.serialize_str(&hex(d)),
        None => ser.serialize_none(),
    }
}

/// Up to this many events are inserted with one placeholder row each;
/// more travel as one JSON array (a statement per size would be prepared
/// on every connection otherwise).
const VALUES_ROWS: usize = 8;

/// Appends `events` in the caller's transaction, in order, with one
/// statement.
pub(crate) async fn append_all(
    conn: &mut MySqlConnection,
    events: &[NewEvent<'_>],
) -> Result<(), CoordinatorError> {
    let query = match events.len() {
        0 => return Ok(()),
        n if n <= VALUES_ROWS => {
            let sql = expand(
                include_str!("queries/batch/insert_events.sql"),
                &[("{rows}", "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", ", ")],
                n,
            );
            let mut q = sqlx::query(&sql);
            for e in events {
                q = q
                    .bind(e.job_id)
                    .bind(e.queue)
                    .bind(e.attempt)
                    .bind(e.kind.as_str())
                    .bind(e.from_state.map(JobState::as_str))
                    .bind(e.to_state.map(JobState::as_str))
                    .bind(e.current_attempt)
                    .bind(e.request_digest.as_ref().map(|d| &d[..]))
                    .bind(e.detail.as_deref())
                    .bind(e.created_at);
            }
            q.execute(conn).await
        }
        _ => {
            for chunk in json_chunks(events)? {
                sqlx::query(include_str!("queries/batch/insert_events_json.sql"))
                    .bind(chunk)
                    .execute(&mut *conn)
                    .await
                    .map_err(convert_sqlx_err)?;
            }
            return Ok(());
        }
    };
    query.map_err(convert_sqlx_err)?;
    Ok(())
}

/// The most bytes of one JSON array of events: well under the smallest
/// default `max_allowed_packet` of the servers jobfence runs on (16 MiB on
/// MariaDB 10.11; 64 MiB on MySQL 8.4).
const JSON_CHUNK_BYTES: usize = 4 << 20;

/// `events` as JSON arrays of at most [`JSON_CHUNK_BYTES`] each, in
/// order: the one array of them all, serialized once, when it fits (as a
/// batch's events nearly always do); else event by event, one larger than
/// the limit alone in its array. A bulk repair of 1,000 jobs with a long
/// reason, escaped twice in each event's detail, is past the server's
/// packet limit as one array.
fn json_chunks(events: &[NewEvent<'_>]) -> Result<Vec<String>, CoordinatorError> {
    let whole = json(events)?;
    if whole.len() <= JSON_CHUNK_BYTES {
        return Ok(vec![whole]);
    }
    let mut chunks = Vec::new();
    let mut current = String::from("[");
    for event in events {
        let one = json(std::slice::from_ref(event))?;
        let one = &one[1..one.len() - 1];
        if current.len() > 1 && current.len() + one.len() + 2 > JSON_CHUNK_BYTES {
            current.push(']');
            chunks.push(std::mem::replace(&mut current, String::from("[")));
        }
        if current.len() > 1 {
            current.push(',');
        }
        current.push_str(one);
    }
    current.push(']');
    chunks.push(current);
    Ok(chunks)
}

/// Appends `events` and commits, in one round trip for a small batch
/// (see [`Tx::commit_after`]); a large one is appended as one JSON array,
/// then committed. Errors as for [`Tx::commit`].
pub(crate) async fn append_and_commit(
    tx: &mut Tx,
    events: &[NewEvent<'_>],
) -> Result<(), CoordinatorError> {
    append_and_commit_with(tx, events, &[]).await
}

/// [`append_and_commit`], running `before` (text statements: a provider's
/// spent units) in the round trip of the COMMIT.
pub(crate) async fn append_and_commit_with(
    tx: &mut Tx,
    events: &[NewEvent<'_>],
    before: &[String],
) -> Result<(), CoordinatorError> {
    if events.len() > VALUES_ROWS {
        append_all(tx, events).await?;
        if before.is_empty() {
            return tx.commit().await;
        }
        return tx.commit_after(before).await;
    }
    let mut statements = before.to_vec();
    if !events.is_empty() {
        statements.push(insert_literal(events));
    }
    tx.commit_after(&statements).await
}

/// The INSERT of a few `events`, with literals.
fn insert_literal(events: &[NewEvent<'_>]) -> String {
    let mut rows = String::new();
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            rows.push_str(", ");
        }
        literal::tuple(
            &mut rows,
            &[
                &e.job_id,
                &e.queue,
                &e.attempt,
                &e.kind.as_str(),
                &e.from_state.map(JobState::as_str),
                &e.to_state.map(JobState::as_str),
                &e.current_attempt,
                &e.request_digest.as_ref().map(|d| &d[..]),
                &e.detail.as_deref(),
                &e.created_at,
            ],
        );
    }
    // Sent as text, parsed on every call: without its comment lines.
    static INSERT: LazyLock<String> =
        LazyLock::new(|| literal::bare(include_str!("queries/batch/insert_events.sql")));
    INSERT.replace("{rows}", &rows)
}

/// Appends one event in the caller's transaction.
pub(crate) async fn append(
    conn: &mut MySqlConnection,
    event: NewEvent<'_>,
) -> Result<(), CoordinatorError> {
    append_all(conn, std::slice::from_ref(&event)).await
}

/// A fenced call to look for among the applied events.
#[derive(Debug, Serialize)]
pub(crate) struct CallKey {
    pub job_id: u64,
    pub attempt: u64,
    /// Hex of the call's digest.
    pub digest: String,
}

impl CallKey {
    pub fn new(job_id: u64, attempt: u64, digest: &[u8; 32]) -> Self {
        CallKey {
            job_id,
            attempt,
            digest: hex(digest),
        }
    }
}

/// The applied event of each earlier identical call among `calls`, by job:
/// `(kind, detail)`. One statement for the whole batch.
pub(crate) async fn find_applied_all(
    conn: &mut MySqlConnection,
    calls: &[CallKey],
) -> Result<HashMap<u64, (String, Option<String>)>, CoordinatorError> {
    let mut out = HashMap::new();
    if calls.is_empty() {
        return Ok(out);
    }
    let found = sqlx::query(include_str!("queries/batch/find_applied.sql"))
        .bind(json(calls)?)
        .fetch_all(conn)
        .await
        .map_err(convert_sqlx_err)?;
    for row in &found {
        let job_id: u64 = rows::get(row, "job_id")?;
        let kind = rows::text(row, "kind")?;
        let detail = rows::opt_text(row, "detail")?;
        out.entry(job_id).or_insert((kind, detail));
    }
    Ok(out)
}

/// The entry of a refused write: the presented attempt, and the job's
/// state and attempt as locked.
pub(crate) fn refusal<'a>(
    job: &'a Job,
    presented: u64,
    kind: EventKind,
    detail: String,
    now: DbTime,
) -> NewEvent<'a> {
    NewEvent {
        job_id: job.id,
        queue: &job.queue,
        attempt: presented,
        kind,
        from_state: Some(job.state),
        to_state: None,
        current_attempt: job.attempt,
        request_digest: None,
        detail: Some(detail),
        created_at: now,
    }
}

/// SHA-256 over length-prefixed parts: the identity of a fenced call.
pub(crate) fn call_digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    h.finalize().into()
}
