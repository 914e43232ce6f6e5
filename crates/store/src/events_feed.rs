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
//! # What this module does (gap tracking with lock probes)
//! 1. Read the next ids after the cursor (by primary key).
//! 2. Walk them from the cursor: while ids are contiguous they are safe.
//!    The ids missing below the last one read are *holes*: each was
//!    allocated before that last id, by a transaction that has either
//!    committed since, rolled back, or is still open.
//! 3. Probe the holes with one `SELECT … FOR UPDATE NOWAIT` over their
//!    primary-key range (READ COMMITTED takes no gap locks). A
//!    row inserted by a transaction that is still open carries its
//!    inserter's lock, so the probe fails at once: hold at that hole and
//!    look again later. A row that the probe returns has committed since.
//!    A row that is not there was rolled back, or (for a few microseconds
//!    inside the INSERT) is allocated but not yet written: a hole with no
//!    row is only passed once the event after it is older than
//!    [`ALLOCATION_GRACE`].
//! 4. Fetch the events up to that horizon.
//!
//! Rejected alternatives. A settle delay ("serve only events older than N
//! seconds") is only as good as the guess that no transaction stays open
//! longer than N between its INSERT and its COMMIT; a paused coordinator, a
//! lost client or a slow COMMIT breaks that guess silently. Asking
//! `information_schema.INNODB_TRX` which writers are still open looks exact
//! but is not: InnoDB serves that table from a cache that is refreshed only
//! when nobody has read it for 100 ms, so under steady polling it can miss a
//! transaction that began after the cache was filled. The lock probe asks
//! the row itself. The remaining assumption (one INSERT statement does not
//! stall for [`ALLOCATION_GRACE`] between taking its id and writing its row)
//! is about one statement's inside, not about a whole transaction's life.
//!
//! Holding costs latency only while a hole exists, bounded by the life of
//! the open transaction that owns it (ours are short: no lock or connection
//! is held across a provider call).

use super::errors::{code, error_number};
use super::pause::PausePoint;
use super::rows::{self, get, opt_text, text};
use super::{convert_sqlx_err, JobStore};
use crate::run::{read, Body};
use jobfence_domain::feed::{FeedEvent, FeedPage};
use jobfence_domain::{CoordinatorError, JobState};
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;
use std::collections::BTreeSet;
use std::time::Duration;

/// How many ids one page looks ahead for holes.
const SCAN_IDS: u32 = 1000;

/// A hole whose row is absent (rolled back, or allocated and not yet
/// written) is passed only once the event after it is this old (DB clock).
pub const ALLOCATION_GRACE: Duration = Duration::from_secs(2);

/// MySQL's error for a NOWAIT locking read that met a lock (MariaDB
/// reports a lock wait timeout, 1205, instead).
const LOCK_NOWAIT: u16 = 3572;

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

/// `EventsCursorPruned` when events after `after` may have been pruned.
async fn pruned_check(conn: &mut MySqlConnection, after: u64) -> Result<(), CoordinatorError> {
    let pruned_through = super::retention::events_pruned_through(conn).await?;
    if after < pruned_through {
        return Err(CoordinatorError::EventsCursorPruned {
            after,
            pruned_through,
        });
    }
    Ok(())
}

impl JobStore {
    /// Committed events with `id > after`, in id order, at most `limit`
    /// (at least 1), only of `queue` if given. See the module docs for why
    /// the page can stop short of events that are already visible.
    /// `EventsCursorPruned` when `after` is below what the pruner removed
    /// (`pruning_marks.events_pruned_through`): never a silent jump.
    /// `DatabaseUnavailable` on a Galera node outside the primary component
    /// (whose reads fail with the lock wait timeout's number, 1205).
    pub async fn list_events(
        &self,
        after: u64,
        limit: u32,
        queue: Option<&str>,
    ) -> Result<FeedPage, CoordinatorError> {
        read!(self, |conn| self.list_events_in(conn, after, limit, queue))
    }

    async fn list_events_in(
        &self,
        conn: &mut MySqlConnection,
        after: u64,
        limit: u32,
        queue: Option<&str>,
    ) -> Body<FeedPage> {
        let limit = limit.max(1);
        let scanned = sqlx::query(include_str!("queries/events_feed/scan_ids.sql"))
            .bind(after)
            .bind(SCAN_IDS)
            .fetch_all(&mut *conn)
            .await?;
        let ids = scanned
            .iter()
            .map(|r| Ok((get::<u64>(r, "id")?, get::<Option<i64>>(r, "age_us")?)))
            .collect::<Result<Vec<_>, CoordinatorError>>()?;
        let horizon = self.horizon(conn, after, &ids).await?;
        self.pause(PausePoint::EventsAfterHorizon).await;
        if horizon == after {
            pruned_check(conn, after).await?;
            return Ok(FeedPage {
                events: Vec::new(),
                next_after: after,
            });
        }
        let sql = match queue {
            Some(_) => include_str!("queries/events_feed/page_of_queue.sql"),
            None => include_str!("queries/events_feed/page.sql"),
        };
        let mut query = sqlx::query(sql).bind(after).bind(horizon);
        if let Some(q) = queue {
            query = query.bind(q);
        }
        let fetched = query.bind(limit).fetch_all(&mut *conn).await?;
        let events = fetched.iter().map(event).collect::<Result<Vec<_>, _>>()?;
        // Read after the events: a pruner that deleted any of the events
        // after the cursor raised the mark in the same transaction, before
        // this read began, so the page is refused rather than served with a
        // silent gap.
        pruned_check(conn, after).await?;
        let next_after = match events.last() {
            Some(last) if events.len() as u32 == limit => last.id,
            _ => horizon,
        };
        Ok(FeedPage { events, next_after })
    }

    /// The highest id up to which every event is final: `after` plus the
    /// contiguous ids, then past each hole that is known not to be open.
    async fn horizon(
        &self,
        conn: &mut MySqlConnection,
        after: u64,
        ids: &[(u64, Option<i64>)],
    ) -> Result<u64, CoordinatorError> {
        let Some(&(last, _)) = ids.last() else {
            return Ok(after);
        };
        // The contiguous run from the cursor needs no probe.
        let mut contiguous = after;
        for (id, _) in ids {
            if *id != contiguous + 1 {
                break;
            }
            contiguous = *id;
        }
        if contiguous == last {
            return Ok(last);
        }
        // One range probe covers every hole however wide (READ COMMITTED
        // takes no gap locks: it locks, and here meets, existing rows only).
        let probe =
            sqlx::query_scalar::<_, u64>(include_str!("queries/events_feed/probe_holes.sql"))
                .bind(contiguous)
                .bind(last)
                .fetch_all(&mut *conn)
                .await;
        let found: BTreeSet<u64> = match probe {
            Ok(found) => found.into_iter().collect(),
            Err(e)
                if matches!(
                    error_number(&e),
                    Some(code::LOCK_WAIT_TIMEOUT | LOCK_NOWAIT)
                ) =>
            {
                // MariaDB answers NOWAIT with 1205, as a Galera node outside
                // the primary component answers its causal reads: the node
                // decides which.
                self.outage_or_conflict(e.to_string()).await?;
                tracing::debug!(
                    after,
                    held_at = contiguous + 1,
                    "events feed holds at a hole still being written"
                );
                return Ok(contiguous);
            }
            Err(e) => return Err(convert_sqlx_err(e)),
        };
        // What is still missing has no row: rolled back, or allocated and
        // not yet written. Pass a missing run only once an event written
        // after it is older than the grace.
        let mut prev = contiguous;
        for id in found.iter().copied().chain(std::iter::once(last)) {
            if id > prev + 1 {
                let next_age = ids
                    .iter()
                    .find(|(seen, _)| *seen >= id)
                    .and_then(|(_, age)| *age)
                    .unwrap_or(0);
                if (next_age.max(0) as u128) < ALLOCATION_GRACE.as_micros() {
                    tracing::debug!(
                        after,
                        held_at = prev + 1,
                        "events feed waits out a fresh hole"
                    );
                    return Ok(prev);
                }
            }
            prev = id;
        }
        Ok(last)
    }

    /// Every event of one job, oldest first.
    pub async fn job_events(&self, job_id: u64) -> Result<Vec<FeedEvent>, CoordinatorError> {
        let fetched = sqlx::query(include_str!("queries/events_feed/of_job.sql"))
            .bind(job_id)
            .fetch_all(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        fetched.iter().map(event).collect()
    }

    /// The largest event id allocated so far, committed or not (0 when
    /// there is none): one dive into the primary key.
    pub async fn last_event_id(&self) -> Result<u64, CoordinatorError> {
        let last: Option<u64> = sqlx::query_scalar(include_str!("queries/events_feed/last_id.sql"))
            .fetch_one(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        Ok(last.unwrap_or(0))
    }
}
