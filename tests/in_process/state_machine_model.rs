//! Property test: random sequences of claims, lease expiries, takeovers,
//! writes, exact replays of earlier writes and closings of the resend
//! window, from several workers, checked call by call against a model of
//! docs/design.md's state machine, on the real database. After every call each
//! stored row must equal the model (state, attempt, next action, dispatches,
//! lease, owner, first dispatch, provider reference, last error, why it is
//! parked, finished), so must its observations and its events (their kinds,
//! in order), and every refusal must carry the reason the model predicts.
//! The operations actually run are counted, and a minimum is asserted.

use jobfence_testkit as kit;

use jobfence_api::v1::{
    self as proto, ClaimRequest, CompleteRequest, FailDisposition, FailRequest,
    RecordObservationRequest, RenewLeaseRequest, TakeoverRequest,
};
use jobfence_domain::{JobState, NextAction};
use kit::{reason, secs, Harness};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};

mod schedules;

const WORKERS: usize = 3;
const MAX_DISPATCHES: u32 = 3; // the default queue policy
pub(crate) fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Random schedules run by the property test.
const CASES: u32 = 64;

#[derive(Debug, Clone)]
enum Op {
    Enqueue,
    Claim {
        worker: usize,
        max: u32,
    },
    Expire {
        job: usize,
    },
    Takeover {
        worker: usize,
        job: usize,
    },
    Complete {
        worker: usize,
        job: usize,
    },
    Fail {
        worker: usize,
        job: usize,
        d: u8,
    },
    Renew {
        worker: usize,
        job: usize,
    },
    Observe {
        worker: usize,
        job: usize,
    },
    /// The worker sends one of its earlier writes again, byte for byte.
    Replay {
        worker: usize,
        call: usize,
    },
    /// The provider's idempotency window of a running job, counted from its
    /// first dispatch, is over (its first dispatch moved 25 h back).
    CloseWindow {
        job: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    // Few jobs, so workers often collide on the same one. A write picks
    // among the jobs its worker believes it holds (`job` modulo them).
    let j = 0..3usize;
    prop_oneof![
        2 => Just(Op::Enqueue),
        3 => (w.clone(), 1..4u32).prop_map(|(worker, max)| Op::Claim { worker, max }),
        3 => j.clone().prop_map(|job| Op::Expire { job }),
        3 => (w.clone(), j.clone()).prop_map(|(worker, job)| Op::Takeover { worker, job }),
        3 => (w.clone(), j.clone()).prop_map(|(worker, job)| Op::Complete { worker, job }),
        3 => (w.clone(), j.clone(), 1..5u8).prop_map(|(worker, job, d)| Op::Fail { worker, job, d }),
        1 => (w.clone(), j.clone()).prop_map(|(worker, job)| Op::Renew { worker, job }),
        1 => (w.clone(), j.clone()).prop_map(|(worker, job)| Op::Observe { worker, job }),
        3 => (w, 0..8usize).prop_map(|(worker, call)| Op::Replay { worker, call }),
        1 => j.prop_map(|job| Op::CloseWindow { job }),
    ]
}

#[derive(Debug, Clone)]
pub(crate) struct ModelJob {
    pub(crate) id: u64,
    state: JobState,
    pub(crate) attempt: u64,
    next_action: NextAction,
    dispatch_count: u32,
    pub(crate) expired: bool,
    lease_owner: Option<String>,
    dispatched: bool,
    window_closed: bool,
    provider_reference: Option<String>,
    last_error: Option<String>,
    state_reason: Option<String>,
    finished: bool,
    observations: i64,
    events: Vec<&'static str>,
    /// Every fenced call applied to the job, as sent: an exact replay of
    /// one is answered as a replay.
    applied: HashSet<String>,
}

impl ModelJob {
    fn claimable(&self) -> bool {
        self.state == JobState::Ready || (self.state == JobState::Running && self.expired)
    }

    /// A job just enqueued (`id`).
    pub(crate) fn new(id: u64) -> ModelJob {
        ModelJob {
            id,
            state: JobState::Ready,
            attempt: 0,
            next_action: NextAction::Execute,
            dispatch_count: 0,
            expired: false,
            lease_owner: None,
            dispatched: false,
            window_closed: false,
            provider_reference: None,
            last_error: None,
            state_reason: None,
            finished: false,
            observations: 0,
            events: vec!["enqueued"],
            applied: HashSet::new(),
        }
    }

    /// The refusal a named Takeover gets now (None: it takes over).
    pub(crate) fn takeover_refusal(&self) -> Option<&'static str> {
        if self.state.is_terminal() {
            Some("JOB_FINISHED")
        } else if self.state != JobState::Running {
            Some("JOB_NOT_RUNNING")
        } else if !self.expired {
            Some("LEASE_NOT_EXPIRED")
        } else {
            None
        }
    }

    /// Claim or Takeover by `worker`.
    pub(crate) fn hand_out(&mut self, worker: usize, takeover: bool) {
        self.attempt += 1;
        if takeover {
            self.next_action = NextAction::Reconcile;
            self.events.push("taken_over");
        } else {
            if self.next_action == NextAction::Execute {
                self.dispatch_count += 1;
                self.dispatched = true;
            }
            self.events.push("claimed");
        }
        self.state = JobState::Running;
        self.expired = false;
        self.lease_owner = Some(format!("w{worker}"));
    }
}

/// A fenced write as sent: sent again unchanged, it is an exact replay.
#[derive(Debug, Clone)]
pub(crate) enum Call {
    Complete(CompleteRequest),
    Fail(FailRequest),
    Renew(RenewLeaseRequest),
}

impl Call {
    fn attempt(&self) -> u64 {
        match self {
            Call::Complete(r) => r.attempt,
            Call::Fail(r) => r.attempt,
            Call::Renew(r) => r.attempt,
        }
    }
}

/// The refusal the fence predicts for a write with `attempt` (None = the
/// caller holds the job).
fn fenced(job: &ModelJob, attempt: u64) -> Option<&'static str> {
    if attempt < job.attempt {
        Some("ATTEMPT_SUPERSEDED")
    } else if job.state != JobState::Running {
        Some("JOB_NOT_RUNNING")
    } else {
        None
    }
}

/// What the model predicts for a fenced call.
#[derive(Debug, PartialEq)]
enum Want {
    Applied,
    Replayed,
    Refused(&'static str),
}

/// A coordinator client.
pub(crate) type Client =
    jobfence_api::v1::job_coordinator_client::JobCoordinatorClient<tonic::transport::Channel>;

/// What a fenced call was answered: (replayed, for a Fail what was applied
/// and why), or the refusal.
pub(crate) type Answer = Result<(bool, Option<(i32, String)>), tonic::Status>;

/// Sends `call`.
pub(crate) async fn send(c: &mut Client, call: &Call) -> Answer {
    match call {
        Call::Complete(r) => c
            .complete(r.clone())
            .await
            .map(|a| (a.get_ref().replayed, None)),
        Call::Fail(r) => c.fail(r.clone()).await.map(|a| {
            let a = a.into_inner();
            (a.replayed, Some((a.applied, a.override_reason)))
        }),
        Call::Renew(r) => c
            .renew_lease(*r)
            .await
            .map(|a| (a.get_ref().replayed, None)),
    }
}

/// Sends `call` and checks the answer against the model, which it updates.
async fn write(c: &mut Client, m: &mut ModelJob, call: &Call, what: &str) {
    let answer = send(c, call).await;
    check(m, call, answer, what);
}

/// Checks what `call` was answered against the model, which it updates.
pub(crate) fn check(m: &mut ModelJob, call: &Call, answer: Answer, what: &str) {
    let signature = format!("{call:?}");
    // A renewal is never answered as a replay: a heartbeat repeats the very
    // same call, each one applied (crates/store/src/writeback.rs).
    let renewal = matches!(call, Call::Renew(_));
    let want = match fenced(m, call.attempt()) {
        None => Want::Applied,
        Some(_) if !renewal && m.applied.contains(&signature) => Want::Replayed,
        Some(r) => Want::Refused(r),
    };
    let (replayed, fail_answer) = match (answer, &want) {
        (Err(s), Want::Refused(r)) => {
            assert_eq!(reason(&s), *r, "{what}: {s:?}");
            m.events.push("stale_write_rejected");
            return;
        }
        (Err(s), _) => panic!("{what}: refused {s:?}, model says {want:?}"),
        (Ok(_), Want::Refused(r)) => panic!("{what}: answered OK, model says {r}"),
        (Ok(a), _) => a,
    };
    assert_eq!(replayed, want == Want::Replayed, "{what}: replayed");
    if want == Want::Replayed {
        return;
    }
    m.applied.insert(signature);
    match call {
        Call::Renew(_) => {
            m.expired = false;
            m.events.push("lease_renewed");
        }
        Call::Complete(r) => {
            m.state = JobState::Succeeded;
            m.provider_reference = Some(r.provider_reference.clone());
            m.state_reason = None;
            m.finished = true;
            m.events.push("completed");
        }
        Call::Fail(r) => {
            let d = FailDisposition::try_from(r.disposition).unwrap();
            let (state, action, why) = match d {
                FailDisposition::RetryReconcile => (JobState::Ready, NextAction::Reconcile, None),
                // Rule 6: a resend only while the provider's window is open
                // and dispatches remain.
                FailDisposition::RetryExecute if m.dispatched && m.window_closed => (
                    JobState::ManualReview,
                    m.next_action,
                    Some("RESEND_WINDOW_CLOSED"),
                ),
                FailDisposition::RetryExecute if m.dispatch_count >= MAX_DISPATCHES => (
                    JobState::ManualReview,
                    m.next_action,
                    Some("MAX_DISPATCHES_REACHED"),
                ),
                FailDisposition::RetryExecute => (JobState::Ready, NextAction::Execute, None),
                FailDisposition::Failed => (JobState::Failed, m.next_action, None),
                _ => (JobState::ManualReview, m.next_action, Some("REQUESTED")),
            };
            let (applied, override_reason) = fail_answer.unwrap();
            let want_applied = match state {
                JobState::ManualReview => FailDisposition::ManualReview,
                _ => d,
            };
            assert_eq!(applied, want_applied as i32, "{what}");
            let want_override = match why {
                Some("REQUESTED") | None => "",
                Some(w) => w,
            };
            assert_eq!(override_reason, want_override, "{what}");
            m.events.push(match state {
                JobState::Ready => "retry_scheduled",
                JobState::Failed => "failed",
                _ => "manual_review",
            });
            m.state = state;
            m.next_action = action;
            m.state_reason = why.map(str::to_owned);
            m.last_error = Some(r.error.clone());
            m.finished = state == JobState::Failed;
            m.expired = false;
        }
    }
}

pub(crate) fn expect(result: Result<(), tonic::Status>, want: Option<&str>, what: &str) {
    match (result, want) {
        (Ok(()), None) => {}
        (Ok(()), Some(w)) => panic!("{what}: applied, model says {w}"),
        (Err(s), None) => panic!("{what}: refused {s:?}, model says applied"),
        (Err(s), Some(w)) => assert_eq!(reason(&s), w, "{what}: {s:?}"),
    }
}

/// The stored job, its observations and its events equal the model.
pub(crate) async fn compare(h: &Harness, m: &ModelJob, what: &str) {
    let row = h.row(m.id).await;
    assert_eq!(
        (
            row.state,
            row.attempt,
            row.next_action,
            row.dispatch_count,
            row.lease_until.is_some(),
        ),
        (
            m.state,
            m.attempt,
            m.next_action,
            m.dispatch_count,
            m.state == JobState::Running,
        ),
        "job {} after {what}",
        m.id
    );
    assert_eq!(
        (
            &row.lease_owner,
            row.first_dispatched_at.is_some(),
            &row.provider_reference,
            &row.last_error,
            &row.state_reason,
            row.finished_at.is_some(),
        ),
        (
            &m.lease_owner,
            m.dispatched,
            &m.provider_reference,
            &m.last_error,
            &m.state_reason,
            m.finished,
        ),
        "job {} after {what}",
        m.id
    );
    let observations: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM job_observations WHERE job_id = ?")
            .bind(m.id)
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(observations, m.observations, "job {} after {what}", m.id);
    let events: Vec<String> = h.events(m.id).await.into_iter().map(|e| e.0).collect();
    assert_eq!(events, m.events, "job {} after {what}", m.id);
}

/// The `n`th job (modulo how many there are) of those that `fit`.
fn pick(jobs: &mut [ModelJob], n: usize, fit: impl Fn(&ModelJob) -> bool) -> Option<&mut ModelJob> {
    let mut fitting: Vec<&mut ModelJob> = jobs.iter_mut().filter(|m| fit(m)).collect();
    if fitting.is_empty() {
        return None;
    }
    let i = n % fitting.len();
    Some(fitting.swap_remove(i))
}
