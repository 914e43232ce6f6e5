//! Background work paced by what it costs the workers (the decision:
//! `jobfence_domain::pacing`): the measuring half. A [`Paced`] run counts
//! the job events committed to its database while each batch runs and
//! while it rests between batches, hands both to its [`Pacer`], and rests
//! as long as the pacer says.
//!
//! Job events are the signal because every coordinator of the database
//! writes them (a claim, a write-back, a renewal, an enqueue: each is one),
//! so workers on other coordinators count as much as this one's, and they
//! need no privilege beyond the tables' (the server's own figures, such as
//! `information_schema.INNODB_METRICS`, need PROCESS on MySQL 8.4 and are
//! server-wide, other schemas' work included). A count is one range read
//! of the primary key from the last event counted.

use super::pause::PausePoint;
use super::{convert_sqlx_err, JobStore};
use jobfence_domain::pacing::{Pace, Pacer, Rest, RestKind, Window};
use jobfence_domain::CoordinatorError;
use std::time::{Duration, Instant};

/// A gap between two batches shorter than this, with no rest taken, is
/// counted with the next batch instead of measured on its own: a count
/// per batch, not two, while the work runs flat out.
const SHORTEST_GAP: Duration = Duration::from_millis(10);

/// The longest rest after one batch: a batch that took very long under
/// load does not stop the work for longer than this.
const MAX_REST: Duration = Duration::from_secs(30);

/// One paced run of background work on one database (module docs):
/// [`batch_starts`](Self::batch_starts) before each batch,
/// [`batch_ended`](Self::batch_ended) after it, then [`rest`](Self::rest).
#[derive(Debug)]
pub struct Paced {
    store: JobStore,
    pacer: Pacer,
    /// The largest event id counted; `None` before the first count.
    mark: Option<u64>,
    /// When the stretch being measured (a batch, or a gap) began.
    since: Instant,
    /// Whether the last batch was followed by a rest.
    rested: bool,
    /// Whether a failed count was logged (once a run).
    warned: bool,
    yielded: Duration,
    probed: Duration,
}

impl JobStore {
    /// A paced run of background work on this database, with the
    /// coordinator's pacing settings.
    pub fn paced(&self) -> Paced {
        self.paced_with(Pacer::default())
    }

    /// The same with a pacer of the caller's.
    pub fn paced_with(&self, pacer: Pacer) -> Paced {
        Paced {
            store: self.clone(),
            pacer,
            mark: None,
            since: Instant::now(),
            rested: false,
            warned: false,
            yielded: Duration::ZERO,
            probed: Duration::ZERO,
        }
    }

    /// The largest job event id (0 with none).
    async fn event_mark(&self) -> Result<u64, CoordinatorError> {
        sqlx::query_scalar(include_str!("queries/pacing/mark.sql"))
            .fetch_one(&self.pool())
            .await
            .map_err(convert_sqlx_err)
    }

    /// Job events above `mark`, and the largest of their ids.
    async fn events_since(&self, mark: u64) -> Result<(u64, Option<u64>), CoordinatorError> {
        let (n, max): (i64, Option<u64>) =
            sqlx::query_as(include_str!("queries/pacing/progress.sql"))
                .bind(mark)
                .fetch_one(&self.pool())
                .await
                .map_err(convert_sqlx_err)?;
        Ok((u64::try_from(n).unwrap_or(0), max))
    }
}

impl Paced {
    /// What the pacer last found.
    pub fn pace(&self) -> Pace {
        self.pacer.pace()
    }

    /// How long the run has rested to leave the database to the workers.
    pub fn yielded(&self) -> Duration {
        self.yielded
    }

    /// How long it has rested to measure the workers' rate without it.
    pub fn probed(&self) -> Duration {
        self.probed
    }

    /// The events counted since the last count, and how long that took;
    /// `None` on the first count or when the count failed (that stretch
    /// is then not used: pacing never fails the work).
    async fn count(&mut self) -> Option<Window> {
        let began = self.since;
        let counted = match self.mark {
            None => self.store.event_mark().await.map(|m| (0, Some(m))),
            Some(mark) => self.store.events_since(mark).await,
        };
        let first = self.mark.is_none();
        self.since = Instant::now();
        match counted {
            Ok((events, max)) => {
                // A deleted newest event (or a restore) may lower MAX(id):
                // the mark only grows, so no event is counted twice.
                self.mark = Some(self.mark.unwrap_or(0).max(max.unwrap_or(0)));
                (!first).then(|| Window {
                    events,
                    seconds: self.since.duration_since(began).as_secs_f64(),
                })
            }
            Err(e) => {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!(
                        error = %e,
                        "pacing: counting the job events failed; the stretches it could not \
                         count are not used (the work goes on, paced by what was counted)"
                    );
                }
                None
            }
        }
    }

    /// A batch starts: the time since the last one ended is measured as a
    /// rest when the work rested, or the gap was long; otherwise it counts
    /// with this batch.
    pub async fn batch_starts(&mut self) {
        if self.mark.is_some() && !self.rested && self.since.elapsed() < SHORTEST_GAP {
            return;
        }
        if let Some(w) = self.count().await {
            self.pacer.rested(w);
        }
        self.rested = false;
    }

    /// The batch ended: it is measured, and the pacer decides how long
    /// to rest after it (nothing when it works flat out); counted as
    /// rested from now. The caller says so where it reports, then
    /// [`rest`](Self::rest)s.
    pub async fn batch_ended(&mut self) -> Rest {
        let none = Rest {
            seconds: 0.0,
            kind: RestKind::None,
        };
        let rest = match self.count().await {
            Some(w) => self.pacer.worked(w),
            None => none,
        };
        if !rest.seconds.is_finite() || rest.seconds <= 0.0 {
            return none;
        }
        let rest = Rest {
            seconds: rest.seconds.min(MAX_REST.as_secs_f64()),
            ..rest
        };
        let took = Duration::from_secs_f64(rest.seconds);
        match rest.kind {
            RestKind::Yield => self.yielded += took,
            RestKind::Probe => self.probed += took,
            RestKind::None => {}
        }
        rest
    }

    /// Rests as [`batch_ended`](Self::batch_ended) decided.
    pub async fn rest(&mut self, rest: &Rest) {
        if rest.kind == RestKind::None || rest.seconds <= 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs_f64(rest.seconds)).await;
        // A test stops here to make the workers move (or not) while the
        // work rests.
        self.store.pause(PausePoint::PacedRest).await;
        self.rested = true;
    }
}
