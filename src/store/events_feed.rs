//! The `job_events` outbox read by cursor (ListEvents, WatchEvents).
//!
//! # The guarantee
//! A consumer that stores the last `event_id` it applied and asks again from
//! there sees every committed event exactly once, in `event_id` order.
//!
//! # Why a plain `WHERE id > cursor` is not enough
//! AUTO_INCREMENT ids are handed out at INSERT, not at COMMIT. Transaction
//! T1 takes id 10, T2 takes id 11, T2 commits first: a reader sees 11 but
//! not 10, and a consumer whose cursor moved to 11 would never see 10.
//! Rolled-back transactions leave holes that never fill, so waiting for
//! every hole is not an answer either.
//!
//! # What this module does (gap tracking, no time guess)
//! 1. Read the next ids after the cursor, and the DB time `t` of that read.
//! 2. Walk them from the cursor: while ids are contiguous they are safe. At
//!    the first hole, ask `information_schema.INNODB_TRX` whether any
//!    transaction that began at or before `t` and can write is still open.
//!    A missing id below a visible one was allocated before that read, by a
//!    transaction that had begun by then: if none of those is still open,
//!    every hole below the last id read is final (committed since, or
//!    rolled back). Otherwise serve only up to the hole and look again later.
//! 3. Fetch the events up to that horizon (a hole that committed between
//!    steps 1 and 3 is then included).
//!
//! A settle delay ("serve only events older than N seconds") was rejected:
//! it is only as good as the guess that no transaction stays open longer
//! than N between its INSERT and its COMMIT, and a paused coordinator, a
//! lost client or a slow COMMIT breaks that guess silently. Holding at a
//! hole costs latency only while one exists, and the cost is bounded by the
//! oldest open writing transaction on the server (a long unrelated one
//! delays the feed; it never makes it skip).
//!
//! Needs the PROCESS privilege (to see other sessions in INNODB_TRX); a
//! server that refuses it makes the feed fail loudly instead of skipping.

use super::rows::{self, get, opt_text, text};
use super::{convert_sqlx_err, JobStore};
use crate::domain::{CoordinatorError, DbTime, JobState};
use sqlx::mysql::MySqlRow;

/// How many ids one page looks ahead for holes.
const SCAN_IDS: u32 = 1000;

/// One entry of the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedEvent {
    /// The cursor value: strictly increasing in the order served.
    pub id: u64,
    pub job_id: u64,
    pub queue: String,
    pub operation_key: String,
    /// The attempt that caused the event (for a refusal: the one presented).
    pub attempt: u64,
    pub kind: String,
    pub from_state: Option<JobState>,
    pub to_state: Option<JobState>,
    /// The job's attempt when the event was written.
    pub current_attempt: u64,
    pub detail: Option<String>,
    pub created_at: DbTime,
}

/// One page of the feed.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedPage {
    pub events: Vec<FeedEvent>,
    /// The cursor for the next call: at or past the last event returned,
    /// never past an event that may still commit.
    pub next_after: u64,
}

const SELECT_EVENTS: &str = "SELECT e.id, e.job_id, e.queue, j.operation_key, e.attempt, e.kind, \
     e.from_state, e.to_state, e.current_attempt, e.detail, e.created_at \
     FROM job_events e JOIN jobs j ON j.id = e.job_id";

fn state(row: &MySqlRow, column: &str) -> Result<Option<JobState>, CoordinatorError> {
    opt_text(row, column)?
        .map(|s| {
            s.parse()
                .map_err(|e| CoordinatorError::Internal(format!("{e}")))
        })
        .transpose()
}

fn event(row: &MySqlRow) -> Result<FeedEvent, CoordinatorError> {
    Ok(FeedEvent {
        id: get(row, "id")?,
        job_id: get(row, "job_id")?,
        queue: text(row, "queue")?,
        operation_key: text(row, "operation_key")?,
        attempt: get(row, "attempt")?,
        kind: text(row, "kind")?,
        from_state: state(row, "from_state")?,
        to_state: state(row, "to_state")?,
        current_attempt: get(row, "current_attempt")?,
        detail: rows::opt_text(row, "detail")?,
        created_at: get(row, "created_at")?,
    })
}

impl JobStore {
    /// Committed events with `id > after`, in id order, at most `limit`
    /// (at least 1), only of `queue` if given. See the module docs for why
    /// the page can stop short of events that are already visible.
    pub async fn list_events(
        &self,
        after: u64,
        limit: u32,
        queue: Option<&str>,
    ) -> Result<FeedPage, CoordinatorError> {
        let limit = limit.max(1);
        let mut conn = self.pool.acquire().await.map_err(convert_sqlx_err)?;
        let scanned = sqlx::query(include_str!("queries/events_feed/scan_ids.sql"))
            .bind(after)
            .bind(SCAN_IDS)
            .fetch_all(&mut *conn)
            .await
            .map_err(convert_sqlx_err)?;
        let Some(first) = scanned.first() else {
            return Ok(FeedPage {
                events: Vec::new(),
                next_after: after,
            });
        };
        let read_at: DbTime = get(first, "read_at")?;
        let ids = scanned
            .iter()
            .map(|r| get::<u64>(r, "id"))
            .collect::<Result<Vec<_>, _>>()?;
        let mut horizon = after;
        let mut hole = false;
        for id in &ids {
            if *id == horizon + 1 {
                horizon = *id;
            } else {
                hole = true;
                break;
            }
        }
        if hole {
            let open: i64 =
                sqlx::query_scalar(include_str!("queries/events_feed/writers_before.sql"))
                    .bind(read_at)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(convert_sqlx_err)?;
            if open == 0 {
                horizon = *ids.last().expect("not empty");
            } else {
                tracing::debug!(
                    after,
                    held_at = horizon + 1,
                    open_writers = open,
                    "events feed holds at a hole until its writer ends"
                );
            }
        }
        self.pause("events.after_horizon").await;
        if horizon == after {
            return Ok(FeedPage {
                events: Vec::new(),
                next_after: after,
            });
        }
        let sql = match queue {
            Some(_) => format!(
                "{SELECT_EVENTS} WHERE e.id > ? AND e.id <= ? AND e.queue = ? ORDER BY e.id LIMIT ?"
            ),
            None => format!("{SELECT_EVENTS} WHERE e.id > ? AND e.id <= ? ORDER BY e.id LIMIT ?"),
        };
        let mut query = sqlx::query(&sql).bind(after).bind(horizon);
        if let Some(q) = queue {
            query = query.bind(q);
        }
        let fetched = query
            .bind(limit)
            .fetch_all(&mut *conn)
            .await
            .map_err(convert_sqlx_err)?;
        let events = fetched.iter().map(event).collect::<Result<Vec<_>, _>>()?;
        let next_after = match events.last() {
            Some(last) if events.len() as u32 == limit => last.id,
            _ => horizon,
        };
        Ok(FeedPage { events, next_after })
    }

    /// Every event of one job, oldest first.
    pub async fn job_events(&self, job_id: u64) -> Result<Vec<FeedEvent>, CoordinatorError> {
        let sql = format!("{SELECT_EVENTS} WHERE e.job_id = ? ORDER BY e.id");
        let fetched = sqlx::query(&sql)
            .bind(job_id)
            .fetch_all(&self.pool)
            .await
            .map_err(convert_sqlx_err)?;
        fetched.iter().map(event).collect()
    }
}
