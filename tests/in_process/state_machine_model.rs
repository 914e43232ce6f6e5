//! Property test: random sequences of claims, lease expiries, takeovers and
//! writes from several workers, checked call by call against a model of
//! DESIGN.md's state machine, on the real database. After every call the
//! stored row must equal the model, and every refusal must carry the reason
//! the model predicts.

use jobfence_testkit as kit;

use jobfence_api::v1::{
    self as proto, ClaimRequest, CompleteRequest, FailDisposition, FailRequest,
    RecordObservationRequest, RenewLeaseRequest, TakeoverRequest,
};
use jobfence_domain::{JobState, NextAction};
use kit::{reason, secs, Harness};
use proptest::prelude::*;
use std::collections::HashMap;

const WORKERS: usize = 3;
const MAX_DISPATCHES: u32 = 3; // the default queue policy

#[derive(Debug, Clone)]
enum Op {
    Enqueue,
    Claim { worker: usize, max: u32 },
    Expire { job: usize },
    Takeover { worker: usize, job: usize },
    Complete { worker: usize, job: usize },
    Fail { worker: usize, job: usize, d: u8 },
    Renew { worker: usize, job: usize },
    Observe { worker: usize, job: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    // Few jobs, so workers often collide on the same one.
    let j = 0..3usize;
    prop_oneof![
        2 => Just(Op::Enqueue),
        3 => (w.clone(), 1..4u32).prop_map(|(worker, max)| Op::Claim { worker, max }),
        3 => j.clone().prop_map(|job| Op::Expire { job }),
        3 => (w.clone(), j.clone()).prop_map(|(worker, job)| Op::Takeover { worker, job }),
        3 => (w.clone(), j.clone()).prop_map(|(worker, job)| Op::Complete { worker, job }),
        3 => (w.clone(), j.clone(), 1..5u8).prop_map(|(worker, job, d)| Op::Fail { worker, job, d }),
        1 => (w.clone(), j.clone()).prop_map(|(worker, job)| Op::Renew { worker, job }),
        1 => (w, j).prop_map(|(worker, job)| Op::Observe { worker, job }),
    ]
}

#[derive(Debug, Clone)]
struct ModelJob {
    id: u64,
    state: JobState,
    attempt: u64,
    next_action: NextAction,
    dispatch_count: u32,
    expired: bool,
}

impl ModelJob {
    fn claimable(&self) -> bool {
        self.state == JobState::Ready || (self.state == JobState::Running && self.expired)
    }
}

/// The refusal the model predicts for a write with `attempt` (None = applied).
fn fenced(job: &ModelJob, attempt: u64) -> Option<&'static str> {
    if attempt < job.attempt {
        Some("ATTEMPT_SUPERSEDED")
    } else if job.state != JobState::Running {
        Some("JOB_NOT_RUNNING")
    } else {
        None
    }
}

fn expect(result: Result<(), tonic::Status>, want: Option<&str>, what: &str) {
    match (result, want) {
        (Ok(()), None) => {}
        (Ok(()), Some(w)) => panic!("{what}: applied, model says {w}"),
        (Err(s), None) => panic!("{what}: refused {s:?}, model says applied"),
        (Err(s), Some(w)) => assert_eq!(reason(&s), w, "{what}: {s:?}"),
    }
}

async fn run(ops: Vec<Op>) {
    let h = Harness::start().await;
    let q = "model";
    let mut c = h.client.clone();
    let mut jobs: Vec<ModelJob> = Vec::new();
    // What each worker believes it holds: job index -> attempt.
    let mut held: Vec<HashMap<usize, u64>> = vec![HashMap::new(); WORKERS];
    let by_id = |jobs: &[ModelJob], id: u64| jobs.iter().position(|j| j.id == id).unwrap();

    for (n, op) in ops.into_iter().enumerate() {
        let what = format!("op {n} {op:?}");
        match op {
            Op::Enqueue => {
                let job = h.enqueue(q, &format!("op-{n}"), "{}").await;
                jobs.push(ModelJob {
                    id: job.job_id,
                    state: JobState::Ready,
                    attempt: 0,
                    next_action: NextAction::Execute,
                    dispatch_count: 0,
                    expired: false,
                });
            }
            Op::Claim { worker, max } => {
                let got = c
                    .claim(ClaimRequest {
                        queue: q.into(),
                        worker_id: format!("w{worker}"),
                        max_jobs: max,
                        lease: secs(600),
                        wait: None,
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .jobs;
                let candidates = jobs.iter().filter(|j| j.claimable()).count();
                let expired = jobs
                    .iter()
                    .filter(|j| j.state == JobState::Running && j.expired)
                    .count();
                assert_eq!(got.len(), candidates.min(max as usize), "{what}");
                let takeovers = got.iter().filter(|g| g.takeover).count();
                assert_eq!(
                    takeovers,
                    expired.min(max as usize),
                    "{what}: expired leases come first"
                );
                for g in got {
                    let pj = g.job.unwrap();
                    let i = by_id(&jobs, pj.job_id);
                    let m = &mut jobs[i];
                    assert!(m.claimable(), "{what}: handed out an unclaimable job");
                    assert_eq!(g.takeover, m.state == JobState::Running, "{what}");
                    m.attempt += 1;
                    assert_eq!(pj.attempt, m.attempt, "{what}");
                    if g.takeover {
                        m.next_action = NextAction::Reconcile;
                    } else if m.next_action == NextAction::Execute {
                        m.dispatch_count += 1;
                    }
                    m.state = JobState::Running;
                    m.expired = false;
                    held[worker].insert(i, m.attempt);
                }
            }
            Op::Expire { job } => {
                if let Some(m) = jobs.get_mut(job) {
                    if m.state == JobState::Running {
                        h.force_lease_expired(m.id).await;
                        m.expired = true;
                    }
                }
            }
            Op::Takeover { worker, job } => {
                let Some(m) = jobs.get_mut(job) else { continue };
                let r = c
                    .takeover(TakeoverRequest {
                        job_id: m.id,
                        worker_id: format!("w{worker}"),
                        lease: secs(600),
                    })
                    .await;
                let want = if m.state.is_terminal() {
                    Some("JOB_FINISHED")
                } else if m.state != JobState::Running {
                    Some("JOB_NOT_RUNNING")
                } else if !m.expired {
                    Some("LEASE_NOT_EXPIRED")
                } else {
                    None
                };
                if want.is_none() {
                    m.attempt += 1;
                    m.next_action = NextAction::Reconcile;
                    m.expired = false;
                    held[worker].insert(job, m.attempt);
                    let got = r.as_ref().expect(&what).get_ref().claimed.as_ref().unwrap();
                    assert_eq!(got.job.as_ref().unwrap().attempt, m.attempt);
                }
                expect(r.map(|_| ()), want, &what);
            }
            Op::Complete { worker, job } => {
                let (Some(m), Some(&a)) = (jobs.get_mut(job), held[worker].get(&job)) else {
                    continue;
                };
                let want = fenced(m, a);
                let r = c
                    .complete(CompleteRequest {
                        job_id: m.id,
                        attempt: a,
                        provider_reference: format!("re_{n}"),
                        result: String::new(),
                    })
                    .await;
                expect(r.map(|_| ()), want, &what);
                if want.is_none() {
                    m.state = JobState::Succeeded;
                }
            }
            Op::Fail { worker, job, d } => {
                let (Some(m), Some(&a)) = (jobs.get_mut(job), held[worker].get(&job)) else {
                    continue;
                };
                let d = FailDisposition::try_from(d as i32).unwrap();
                let want = fenced(m, a);
                let r = c
                    .fail(FailRequest {
                        job_id: m.id,
                        attempt: a,
                        disposition: d as i32,
                        error: format!("error of op {n}"),
                        retry_delay: secs(0),
                        provider_retry_after: None,
                    })
                    .await;
                if want.is_none() {
                    let (state, action) = match d {
                        FailDisposition::RetryReconcile => (JobState::Ready, NextAction::Reconcile),
                        FailDisposition::RetryExecute if m.dispatch_count >= MAX_DISPATCHES => {
                            (JobState::ManualReview, m.next_action)
                        }
                        FailDisposition::RetryExecute => (JobState::Ready, NextAction::Execute),
                        FailDisposition::Failed => (JobState::Failed, m.next_action),
                        _ => (JobState::ManualReview, m.next_action),
                    };
                    let applied = r.as_ref().expect(&what).get_ref().applied;
                    let want_applied = match state {
                        JobState::ManualReview => FailDisposition::ManualReview,
                        _ => d,
                    };
                    assert_eq!(applied, want_applied as i32, "{what}");
                    m.state = state;
                    m.next_action = action;
                    m.expired = false;
                }
                expect(r.map(|_| ()), want, &what);
            }
            Op::Renew { worker, job } => {
                let (Some(m), Some(&a)) = (jobs.get_mut(job), held[worker].get(&job)) else {
                    continue;
                };
                let want = fenced(m, a);
                let r = c
                    .renew_lease(RenewLeaseRequest {
                        job_id: m.id,
                        attempt: a,
                        lease: secs(600 + n as i64),
                    })
                    .await;
                expect(r.map(|_| ()), want, &what);
                if want.is_none() {
                    m.expired = false;
                }
            }
            Op::Observe { worker, job } => {
                let (Some(m), Some(&a)) = (jobs.get(job), held[worker].get(&job)) else {
                    continue;
                };
                c.record_observation(RecordObservationRequest {
                    job_id: m.id,
                    attempt: a,
                    source: proto::ObservationSource::Worker as i32,
                    outcome: proto::ObservationOutcome::Succeeded as i32,
                    provider_reference: format!("re_{n}"),
                    body: "{}".into(),
                    dedup_key: format!("op-{n}"),
                })
                .await
                .expect(&what);
            }
        }
        // The stored rows equal the model after every call.
        for m in &jobs {
            let row = h.row(m.id).await;
            assert_eq!(
                (row.state, row.attempt, row.next_action, row.dispatch_count),
                (m.state, m.attempt, m.next_action, m.dispatch_count),
                "job {} after {what}",
                m.id
            );
            assert_eq!(row.lease_until.is_some(), row.state == JobState::Running);
        }
    }
    h.finish().await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_schedules_follow_the_state_machine(ops in proptest::collection::vec(op(), 1..60)) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(ops));
    }
}
