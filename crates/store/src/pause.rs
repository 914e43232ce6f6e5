//! Pause points inside store transactions, for deterministic race tests:
//! a test arms a point, waits until a call reaches it (holding whatever
//! row locks it has taken so far), runs a competing call, then releases
//! the first one.
//!
//! The points are named by [`PausePoint`]. The machinery to arm them
//! ([`PausePoints`], [`Armed`], [`JobStore::with_pause_points`]) exists only
//! with the crate's `testsuite` feature, which only the test kit and
//! dev-dependencies turn on: a production build has no pause points, and a
//! call passing one costs nothing.
//!
//! [`JobStore::with_pause_points`]: crate::JobStore::with_pause_points

/// Where a store call can be stopped by a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PausePoint {
    /// The claim scan has locked its candidate rows (`SELECT … FOR UPDATE
    /// SKIP LOCKED`), nothing is updated yet.
    ClaimAfterScan,
    /// A claim has read its queue's rules (which said a lease ran out, or
    /// left something to read: the count of jobs in flight under a cap set
    /// since, the queue's own row) and locked its ready rows; the second
    /// round trip is next (inside the transaction).
    ClaimBetweenScans,
    /// The claim's updates are done, COMMIT is next (inside the
    /// transaction: [`Armed::connection_id`] names its session).
    ClaimBeforeCommit,
    /// A takeover holds the job's row lock and has checked that the lease
    /// expired, nothing is updated yet.
    TakeoverAfterLock,
    /// A fenced write (RenewLease, Complete, Fail) holds the row lock,
    /// nothing is updated yet (a lone Complete or Fail that asks for its
    /// next job of a queue without a provider also holds the rows its
    /// claim's scans locked: they go in one round trip).
    WriteAfterLock,
    /// A fenced write's updates are done, COMMIT is next (inside the
    /// transaction).
    WriteBeforeCommit,
    /// A takeover's updates and its event are written (the event's id is
    /// allocated, its row locked and not yet visible), COMMIT is next
    /// (inside the transaction).
    TakeoverBeforeCommit,
    /// A Complete or Fail that claims its caller's next jobs (one
    /// transaction, docs/design.md rule 16) has written both halves; its
    /// events and COMMIT go next, in one round trip (inside the
    /// transaction).
    HandoffBeforeCommit,
    /// An Enqueue found its new keys free; their INSERTs, events and
    /// COMMIT go next, in one round trip (inside the transaction).
    EnqueueBeforeCommit,
    /// A ResolveManualReview holds the row lock and has read the state it
    /// decides on, nothing is updated yet; a BulkRepair's fail or requeue
    /// holds the row locks of every job of its batch there.
    ResolveAfterLock,
    /// The same for CancelJob, and a BulkRepair's cancel.
    CancelAfterLock,
    /// A RetryAsNewOperation holds the old job's row lock and has read
    /// whether it was tried again already; nothing is written yet.
    RetryAfterLock,
    /// A ListEvents page has decided how far it may serve, and has not
    /// read the events yet.
    EventsAfterHorizon,
    /// A RecordObservation holds its job's row lock and has
    /// written nothing yet (inside the transaction).
    ObservationAfterLock,
    /// A batch of settlement lines holds the locks of the lines it found
    /// (inside the transaction), and has written nothing yet.
    SettlementLinesLocked,
    /// A batch of settlement lines holds its lines' and their finished
    /// holders' locks and has decided which new lines it inserts decided;
    /// it has written nothing yet (inside the transaction).
    SettlementBeforeInsert,
    /// A settlement decision has read who holds its keys, and has written
    /// nothing of it yet (outside any transaction).
    SettlementAfterHolders,
    /// A settlement import is about to read the lines left undecided and
    /// decide them (its batch is written; outside any transaction).
    SettlementBeforeDecide,
    /// Raising a settlement exception found none of its kind for its
    /// subject (a locking read) and has not inserted it yet (inside the
    /// transaction).
    SettlementRaiseAfterRead,
    /// A pruning batch has read its candidate ids (a plain read), and has
    /// not locked them yet.
    PruneAfterCandidates,
    /// A pruning batch holds its jobs' row locks and has deleted nothing
    /// yet (inside the transaction).
    PruneAfterLock,
    /// A paced run of background work (the settlement import:
    /// `crate::pacing`) has slept through a rest between two batches; the
    /// rest lasts until the test releases it, and the job events committed
    /// meanwhile count as the workers' progress without the work (outside
    /// any transaction).
    PacedRest,
    /// A schema transition's backfill holds the transition's row lock and
    /// has changed nothing yet (inside the transaction).
    BackfillBeforeWrite,
}

#[cfg(feature = "testsuite")]
pub use armed::{Armed, PausePoints};

#[cfg(feature = "testsuite")]
mod armed {
    use super::PausePoint;
    use sqlx::MySqlConnection;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use tokio::sync::oneshot;

    /// The points a test armed, shared with the store that stops at them.
    #[derive(Debug, Default, Clone)]
    pub struct PausePoints {
        armed: Arc<Mutex<HashMap<PausePoint, Gate>>>,
    }

    #[derive(Debug)]
    struct Gate {
        reached: oneshot::Sender<Option<u64>>,
        release: oneshot::Receiver<()>,
    }

    /// The test's side of an armed point.
    #[derive(Debug)]
    pub struct Armed {
        reached: oneshot::Receiver<Option<u64>>,
        connection_id: Option<u64>,
        release: Option<oneshot::Sender<()>>,
    }

    impl Armed {
        /// Waits until a call has reached the point and is paused there.
        pub async fn reached(&mut self) {
            let id = (&mut self.reached)
                .await
                .expect("the paused call was dropped before reaching its pause point");
            self.connection_id = id;
        }

        /// The database session (`CONNECTION_ID()`) of the paused
        /// transaction, once [`reached`](Self::reached) returned, for points
        /// inside a transaction ([`PausePoint::ClaimBeforeCommit`],
        /// [`PausePoint::WriteBeforeCommit`], [`PausePoint::TakeoverBeforeCommit`],
        /// [`PausePoint::EnqueueBeforeCommit`]): a test kills exactly that
        /// session to lose the COMMIT, without searching
        /// `information_schema` (whose InnoDB views are cached snapshots).
        pub fn connection_id(&self) -> Option<u64> {
            self.connection_id
        }

        /// Lets the paused call go on.
        pub fn release(&mut self) {
            if let Some(tx) = self.release.take() {
                let _ = tx.send(());
            }
        }
    }

    impl Drop for Armed {
        fn drop(&mut self) {
            self.release();
        }
    }

    impl PausePoints {
        /// No point armed.
        pub fn new() -> Self {
            Self::default()
        }

        /// Arms `point` for the next call that reaches it (only that one
        /// pauses).
        pub fn arm(&self, point: PausePoint) -> Armed {
            let (reached_tx, reached_rx) = oneshot::channel();
            let (release_tx, release_rx) = oneshot::channel();
            self.armed.lock().expect("pause points poisoned").insert(
                point,
                Gate {
                    reached: reached_tx,
                    release: release_rx,
                },
            );
            Armed {
                reached: reached_rx,
                connection_id: None,
                release: Some(release_tx),
            }
        }

        /// Called by the store: pauses here if a test armed this point.
        pub(crate) async fn pause(&self, point: PausePoint) {
            if let Some(gate) = self.take(point) {
                let _ = gate.reached.send(None);
                let _ = gate.release.await;
            }
        }

        /// Like [`pause`](Self::pause), inside a transaction: tells the
        /// test which database session holds it.
        pub(crate) async fn pause_in(&self, point: PausePoint, conn: &mut MySqlConnection) {
            if let Some(gate) = self.take(point) {
                let id: Option<u64> =
                    sqlx::query_scalar(include_str!("queries/server/connection_id.sql"))
                        .fetch_one(&mut *conn)
                        .await
                        .ok();
                let _ = gate.reached.send(id);
                let _ = gate.release.await;
            }
        }

        fn take(&self, point: PausePoint) -> Option<Gate> {
            self.armed
                .lock()
                .expect("pause points poisoned")
                .remove(&point)
        }
    }
}
