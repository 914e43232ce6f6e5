//! Long-poll Claim: a Claim with a `wait` that finds nothing waits, without
//! querying, until work may be claimable, then claims again.
//!
//! What wakes a waiting Claim of a queue:
//! - an Enqueue of the queue through this coordinator, at once (or when
//!   its delay ends), and a Fail that schedules a retry, when it is due;
//! - the time the database said the next job becomes claimable (the
//!   earliest `run_at` of a ready job or `lease_until` of a running one,
//!   read by the empty claim itself), and the end of any lease this
//!   coordinator hands out meanwhile: a crashed worker's job is claimed
//!   again about when its lease ends;
//! - every `poll_interval` in any case: the bound for work that reaches
//!   the database through another coordinator, which this one cannot see;
//! - the end of the wait (an empty answer), or a shutdown (an empty answer
//!   at once, so a draining coordinator holds no Claim open).
//!
//! All of this only decides *when to ask*; whether a job is claimable is
//! decided by the claim transaction, by the database clock, as always.

use jobfence_domain::budget::waiters::{WaiterTicket, WAITER_TTL_POLLS};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Long-poll settings.
#[derive(Debug, Clone, Copy)]
pub struct LongPollSettings {
    /// Longest `wait` a Claim gets; a longer one is cut to this.
    pub max_wait: Duration,
    /// How often a waiting Claim looks again even if nothing woke it: the
    /// bound for work enqueued or released through another coordinator.
    pub poll_interval: Duration,
    /// Most Claims waiting at once on this coordinator; past it a Claim
    /// that finds nothing answers empty at once.
    pub max_waiters: usize,
}

impl Default for LongPollSettings {
    fn default() -> Self {
        LongPollSettings {
            max_wait: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            max_waiters: 10_000,
        }
    }
}

/// After an empty claim whose scan saw a job already due (a concurrent
/// claim held its row), look again after this, not in a tight loop.
const BUSY_RETRY: Duration = Duration::from_millis(20);

/// What waiting Claims of one queue watch.
#[derive(Debug)]
struct QueueSignal {
    /// Bumped when work may be claimable now.
    work: watch::Sender<u64>,
    /// When the next job is expected to become claimable, as best known;
    /// a change is announced on the channel so waiters plan again.
    due: watch::Sender<Option<Instant>>,
}

/// The waiting Claims of a coordinator, by queue. Cheap to share.
#[derive(Debug)]
pub struct Waiters {
    settings: LongPollSettings,
    queues: Mutex<HashMap<String, Arc<QueueSignal>>>,
    draining: watch::Sender<bool>,
    parked: AtomicUsize,
}

/// Why [`Waiters::wait`] returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    /// Claim again.
    Claim,
    /// Answer empty: the wait is over, or the coordinator is draining.
    GiveUp,
}

/// A Claim registered as waiting on one queue (see [`Waiters::register`]).
pub struct Waiting<'a> {
    waiters: &'a Waiters,
    signal: Arc<QueueSignal>,
    work: watch::Receiver<u64>,
    due: watch::Receiver<Option<Instant>>,
    deadline: Instant,
    /// Its ticket's id among its provider's waiters (never 0).
    ticket: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.waiters.parked.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Waiters {
    pub fn new(settings: LongPollSettings) -> Self {
        Waiters {
            settings,
            queues: Mutex::default(),
            draining: watch::channel(false).0,
            parked: AtomicUsize::new(0),
        }
    }

    pub fn settings(&self) -> LongPollSettings {
        self.settings
    }

    /// Claims waiting now.
    pub fn waiting(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    fn signal(&self, queue: &str) -> Arc<QueueSignal> {
        let mut queues = self.queues.lock().expect("waiters poisoned");
        if let Some(s) = queues.get(queue) {
            return s.clone();
        }
        let s = Arc::new(QueueSignal {
            work: watch::channel(0).0,
            due: watch::channel(None).0,
        });
        queues.insert(queue.to_owned(), s.clone());
        s
    }

    fn existing(&self, queue: &str) -> Option<Arc<QueueSignal>> {
        self.queues
            .lock()
            .expect("waiters poisoned")
            .get(queue)
            .cloned()
    }

    /// Registers a Claim of `queue` that may wait `wait` (cut to the
    /// maximum), *before* its first claim, so that work arriving between
    /// that claim and the wait still wakes it. `None` when it must not
    /// wait: no wait asked, too many waiting, or draining.
    pub fn register(&self, queue: &str, wait: Duration) -> Option<Waiting<'_>> {
        if wait.is_zero() || *self.draining.borrow() {
            return None;
        }
        if self.parked.fetch_add(1, Ordering::Relaxed) >= self.settings.max_waiters {
            self.parked.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let signal = self.signal(queue);
        let mut work = signal.work.subscribe();
        work.mark_unchanged();
        let due = signal.due.subscribe();
        Some(Waiting {
            waiters: self,
            work,
            due,
            signal,
            deadline: Instant::now() + wait.min(self.settings.max_wait),
            ticket: fastrand::u64(1..),
        })
    }

    /// Work of `queue` may be claimable now (an Enqueue, a retry).
    pub fn work_available(&self, queue: &str) {
        if let Some(s) = self.existing(queue) {
            s.work.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A job of `queue` becomes claimable in `d` (a delayed Enqueue, a
    /// retry delay, a lease handed out): waiters wake then at the latest.
    pub fn due_in(&self, queue: &str, d: Duration) {
        if d.is_zero() {
            return self.work_available(queue);
        }
        if let Some(s) = self.existing(queue) {
            let at = Instant::now() + d;
            s.due.send_if_modified(|due| match due {
                Some(t) if *t <= at && *t > Instant::now() => false,
                _ => {
                    *due = Some(at);
                    true
                }
            });
        }
    }

    /// Every waiting Claim answers empty now, and none waits from now on.
    pub fn drain(&self) {
        self.draining.send_replace(true);
    }
}

impl Waiting<'_> {
    /// The ticket its next look carries: held back by its provider's
    /// budget, the Claim waits its turn among every coordinator's waiters
    /// (docs/design.md rule 11), its registration living for the rest of
    /// its wait, at most [`WAITER_TTL_POLLS`] poll intervals (it looks
    /// again at least once a poll interval).
    pub fn ticket(&self) -> WaiterTicket {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let most = self.waiters.settings.poll_interval * WAITER_TTL_POLLS;
        WaiterTicket {
            id: self.ticket,
            ttl: left.min(most).max(Duration::from_millis(1)),
        }
    }

    /// After an empty claim: `next_due` is what that claim read from the
    /// database (how long until the next job of the queue is claimable;
    /// `None` if nothing is pending). Waits until it is time to claim
    /// again, or gives up.
    pub async fn wait(&mut self, next_due: Option<Duration>) -> Wake {
        self.wait_from(next_due, Instant::now()).await
    }

    /// [`wait`](Self::wait), `next_due` counted from `asked`: when the
    /// claim that read it was sent (its database clock was read then, not
    /// when its COMMIT came back), so that a turn at the budget is looked
    /// at when its units are due, not a commit's latency later.
    pub async fn wait_from(&mut self, next_due: Option<Duration>, asked: Instant) -> Wake {
        let now = Instant::now();
        // The database's answer is this Claim's own time to look again (a
        // waiter's turn at its provider's budget is its own: rule 11). It
        // also replaces a shared hint already past: it saw every
        // coordinator's jobs. Already due but not ours (a concurrent claim
        // held the row): look again shortly, not in a tight loop; due
        // later (a turn at the budget, a delay): exactly then.
        let mine = next_due.map(|d| match d.is_zero() {
            true => now + BUSY_RETRY,
            false => (asked + d).max(now),
        });
        self.signal.due.send_if_modified(|due| match *due {
            Some(t) if t > now => false,
            _ => {
                *due = mine;
                true
            }
        });
        self.due.mark_unchanged();
        let mut draining = self.waiters.draining.subscribe();
        loop {
            let now = Instant::now();
            if *draining.borrow_and_update() || now >= self.deadline {
                return Wake::GiveUp;
            }
            let due = *self.due.borrow_and_update();
            let poll = now + self.waiters.settings.poll_interval;
            let until = [Some(self.deadline), Some(poll), due, mine]
                .into_iter()
                .flatten()
                .min()
                .expect("a deadline");
            tokio::select! {
                _ = self.work.changed() => return Wake::Claim,
                _ = self.due.changed() => continue,
                _ = draining.changed() => continue,
                _ = tokio::time::sleep_until(until) => {
                    if until >= self.deadline {
                        return Wake::GiveUp;
                    }
                    return Wake::Claim;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiters() -> Waiters {
        Waiters::new(LongPollSettings {
            max_wait: Duration::from_secs(30),
            poll_interval: Duration::from_secs(3600),
            max_waiters: 2,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_enqueue_wakes_a_waiting_claim_of_its_queue_only() {
        let w = waiters();
        let mut refunds = w.register("refunds", Duration::from_secs(10)).unwrap();
        let mut payouts = w.register("payouts", Duration::from_secs(10)).unwrap();
        w.work_available("refunds");
        assert_eq!(refunds.wait(None).await, Wake::Claim);
        let started = Instant::now();
        assert_eq!(payouts.wait(None).await, Wake::GiveUp);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_wakes_when_the_database_said_the_next_job_is_due() {
        let w = waiters();
        let mut waiting = w.register("refunds", Duration::from_secs(30)).unwrap();
        let started = Instant::now();
        assert_eq!(
            waiting.wait(Some(Duration::from_secs(2))).await,
            Wake::Claim
        );
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_handed_out_meanwhile_moves_the_wake_up_earlier() {
        let w = Arc::new(waiters());
        let mut waiting = w.register("refunds", Duration::from_secs(30)).unwrap();
        let started = Instant::now();
        let wake = waiting.wait(None);
        tokio::pin!(wake);
        tokio::select! {
            _ = &mut wake => panic!("woke with nothing due"),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        w.due_in("refunds", Duration::from_secs(5));
        assert_eq!(wake.await, Wake::Claim);
        assert_eq!(started.elapsed(), Duration::from_secs(6));
    }

    #[tokio::test(start_paused = true)]
    async fn draining_answers_every_waiting_claim_and_refuses_new_waits() {
        let w = waiters();
        let mut waiting = w.register("refunds", Duration::from_secs(30)).unwrap();
        w.drain();
        assert_eq!(waiting.wait(None).await, Wake::GiveUp);
        assert!(w.register("refunds", Duration::from_secs(30)).is_none());
    }

    #[tokio::test]
    async fn waiters_are_bounded() {
        let w = waiters();
        let a = w.register("q", Duration::from_secs(1));
        let b = w.register("q", Duration::from_secs(1));
        assert!(a.is_some() && b.is_some());
        assert!(w.register("q", Duration::from_secs(1)).is_none());
        drop(a);
        assert!(w.register("q", Duration::from_secs(1)).is_some());
    }
}
