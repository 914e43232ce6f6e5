//! The `job_events` log: every transition and every rejected stale write,
//! written in the transaction of the change. Applied fenced calls carry a
//! digest of the request, which is how an exact replay is recognised.

use super::convert_sqlx_err;
use crate::domain::{CoordinatorError, Job, JobState};
use sha2::{Digest, Sha256};
use sqlx::MySqlConnection;

/// What kind of entry, as stored in `job_events.kind`.
pub(crate) mod kind {
    pub const ENQUEUED: &str = "enqueued";
    pub const CLAIMED: &str = "claimed";
    pub const TAKEN_OVER: &str = "taken_over";
    pub const LEASE_RENEWED: &str = "lease_renewed";
    pub const COMPLETED: &str = "completed";
    pub const RETRY_SCHEDULED: &str = "retry_scheduled";
    pub const FAILED: &str = "failed";
    pub const MANUAL_REVIEW: &str = "manual_review";
    pub const STALE_WRITE_REJECTED: &str = "stale_write_rejected";
}

/// One entry to append.
#[derive(Debug)]
pub(crate) struct NewEvent<'a> {
    pub job_id: u64,
    pub queue: &'a str,
    /// The attempt that caused it (for a rejection, the one presented).
    pub attempt: u64,
    pub kind: &'static str,
    pub from_state: Option<JobState>,
    pub to_state: Option<JobState>,
    /// The job's attempt after the change.
    pub current_attempt: u64,
    /// Set for applied fenced calls only.
    pub request_digest: Option<[u8; 32]>,
    pub detail: Option<String>,
}

/// Appends `event` in the caller's transaction.
pub(crate) async fn append(
    conn: &mut MySqlConnection,
    event: NewEvent<'_>,
) -> Result<(), CoordinatorError> {
    sqlx::query(include_str!("queries/events/insert.sql"))
        .bind(event.job_id)
        .bind(event.queue)
        .bind(event.attempt)
        .bind(event.kind)
        .bind(event.from_state.map(|s| s.as_str()))
        .bind(event.to_state.map(|s| s.as_str()))
        .bind(event.current_attempt)
        .bind(event.request_digest.as_ref().map(|d| &d[..]))
        .bind(event.detail)
        .execute(conn)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(())
}

/// The applied event of an earlier identical call, if there was one:
/// `(kind, detail)`.
pub(crate) async fn find_applied(
    conn: &mut MySqlConnection,
    job_id: u64,
    attempt: u64,
    digest: &[u8; 32],
) -> Result<Option<(String, Option<String>)>, CoordinatorError> {
    let row = sqlx::query(include_str!("queries/events/find_applied.sql"))
        .bind(job_id)
        .bind(attempt)
        .bind(&digest[..])
        .fetch_optional(conn)
        .await
        .map_err(convert_sqlx_err)?;
    row.map(|r| {
        Ok((
            super::rows::text(&r, "kind")?,
            super::rows::opt_text(&r, "detail")?,
        ))
    })
    .transpose()
}

/// Logs a refused write (`kind`, with the presented attempt and the job's
/// current one) and commits that entry alone, then returns the refusal.
/// Nothing of the job changed; the refusal stands even if its audit entry
/// cannot be committed.
pub(crate) async fn refuse<T>(
    mut tx: sqlx::Transaction<'static, sqlx::MySql>,
    job: &Job,
    presented: u64,
    kind: &'static str,
    detail: String,
    refusal: CoordinatorError,
) -> Result<T, CoordinatorError> {
    append(
        &mut tx,
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
        },
    )
    .await?;
    if let Err(e) = super::commit(tx).await {
        tracing::warn!(job_id = job.id, kind, error = %e, "could not log a refused write");
    }
    Err(refusal)
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
