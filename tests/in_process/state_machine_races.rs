//! The state-machine model under concurrency: two clients race on one
//! running job whose lease expired, on a deterministic schedule. The first
//! call stops while it holds the job's row lock (a pause point); the second
//! is sent and either waits for that lock (a fenced write, a named
//! Takeover: seen waiting in InnoDB) or skips the row (a Claim's SKIP
//! LOCKED: answered empty at once); then the first goes on. Both answers,
//! the row and its events must be the model's for the first call, then the
//! second. Every pair is run (two fenced writes are left out: they share
//! the write pipeline, which orders them itself; see group_commit.rs).

use crate::state_machine_model::{
    block_on, check, compare, expect, send, Answer, Call, Client, ModelJob,
};
use jobfence_api::v1::{
    ClaimRequest, ClaimedJob, CompleteRequest, FailRequest, RenewLeaseRequest, TakeoverRequest,
    TakeoverResponse,
};
use jobfence_store::PausePoint;
use jobfence_testkit::{secs, Harness};

const Q: &str = "model";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Racer {
    Complete,
    Fail(i32),
    Renew,
    Takeover,
    Claim,
}

impl Racer {
    fn is_write(self) -> bool {
        matches!(self, Racer::Complete | Racer::Fail(_) | Racer::Renew)
    }

    /// Where it stops holding the row lock, when it runs first.
    fn pause(self) -> PausePoint {
        match self {
            Racer::Takeover => PausePoint::TakeoverAfterLock,
            Racer::Claim => PausePoint::ClaimAfterScan,
            _ => PausePoint::WriteAfterLock,
        }
    }
}

/// What a racer was answered.
enum Outcome {
    Write(Box<(Call, Answer)>),
    Takeover(usize, Box<Result<TakeoverResponse, tonic::Status>>),
    Claim(usize, Vec<ClaimedJob>),
}

/// Sends `r`: writes as the holder `w0` of `attempt`, takeovers and
/// claims as worker `w`.
async fn run(mut c: Client, r: Racer, job_id: u64, attempt: u64, w: usize) -> Outcome {
    let write = match r {
        Racer::Complete => Call::Complete(CompleteRequest {
            job_id,
            attempt,
            provider_reference: "re_race".into(),
            result: String::new(),
            next: None,
        }),
        Racer::Fail(d) => Call::Fail(FailRequest {
            job_id,
            attempt,
            disposition: d,
            error: "error of the race".into(),
            retry_delay: secs(0),
            provider_retry_after: None,
            next: None,
        }),
        Racer::Renew => Call::Renew(RenewLeaseRequest {
            job_id,
            attempt,
            lease: secs(900),
        }),
        Racer::Takeover => {
            let r = c
                .takeover(TakeoverRequest {
                    job_id,
                    worker_id: format!("w{w}"),
                    lease: secs(600),
                })
                .await
                .map(|r| r.into_inner());
            return Outcome::Takeover(w, Box::new(r));
        }
        Racer::Claim => {
            let jobs = c
                .claim(ClaimRequest {
                    queue: Q.into(),
                    worker_id: format!("w{w}"),
                    max_jobs: 1,
                    lease: secs(600),
                    wait: None,
                })
                .await
                .unwrap()
                .into_inner()
                .jobs;
            return Outcome::Claim(w, jobs);
        }
    };
    let answer = send(&mut c, &write).await;
    Outcome::Write(Box::new((write, answer)))
}

/// Applies what `o` was answered to the model, checking it. `first`: it
/// held the lock; a Claim that ran second skipped the locked row.
fn apply(m: &mut ModelJob, o: Outcome, first: bool, what: &str) {
    match o {
        Outcome::Write(w) => {
            let (call, answer) = *w;
            check(m, &call, answer, what)
        }
        Outcome::Takeover(w, r) => {
            let r = *r;
            let want = m.takeover_refusal();
            if want.is_none() {
                m.hand_out(w, true);
                let got = r.as_ref().expect(what).claimed.as_ref().unwrap();
                assert_eq!(got.job.as_ref().unwrap().attempt, m.attempt, "{what}");
            }
            expect(r.map(|_| ()), want, what);
        }
        Outcome::Claim(w, jobs) if first => {
            assert_eq!(jobs.len(), 1, "{what}: the expired lease is taken over");
            assert!(jobs[0].takeover, "{what}");
            m.hand_out(w, true);
            assert_eq!(jobs[0].job.as_ref().unwrap().attempt, m.attempt, "{what}");
        }
        Outcome::Claim(_, jobs) => {
            assert!(jobs.is_empty(), "{what}: a locked row is skipped");
        }
    }
}

async fn race(first: Racer, second: Racer) {
    let what = format!("{first:?} holding the lock, then {second:?}");
    let h = Harness::start().await;
    let job = h.enqueue(Q, "race", "{}").await;
    let held = h.claim_one(Q, "w0").await;
    let mut m = ModelJob::new(job.job_id);
    m.hand_out(0, false);
    assert_eq!(held.attempt, m.attempt);
    h.force_lease_expired(job.job_id).await;
    m.expired = true;
    compare(&h, &m, "the setup").await;

    let mut gate = h.pauses.arm(first.pause());
    let f = tokio::spawn(run(
        h.another_client().await,
        first,
        job.job_id,
        held.attempt,
        1,
    ));
    gate.reached().await;
    let s = tokio::spawn(run(
        h.another_client().await,
        second,
        job.job_id,
        held.attempt,
        2,
    ));
    // A Claim skips the locked row and answers now; anything else waits.
    let (second_answer, waiting) = if second == Racer::Claim {
        (Some(s.await.unwrap()), None)
    } else {
        jobfence_testkit::until_lock_wait(&h.pool, &h.db.name).await;
        (None, Some(s))
    };
    gate.release();
    let first_answer = f.await.unwrap();
    let second_answer = match (second_answer, waiting) {
        (Some(a), _) => a,
        (None, Some(s)) => s.await.unwrap(),
        (None, None) => unreachable!("the second call is answered or waiting"),
    };
    apply(&mut m, first_answer, true, &format!("{what}: the first"));
    apply(&mut m, second_answer, false, &format!("{what}: the second"));
    compare(&h, &m, &what).await;
    h.finish().await;
}

#[test]
fn two_clients_racing_on_one_job_follow_the_state_machine() {
    let racers = [
        Racer::Complete,
        Racer::Fail(1),
        Racer::Fail(2),
        Racer::Fail(3),
        Racer::Fail(4),
        Racer::Renew,
        Racer::Takeover,
        Racer::Claim,
    ];
    let mut raced = 0;
    for first in racers {
        for second in racers {
            if (first.is_write() && second.is_write())
                || (first == Racer::Claim && second == Racer::Claim)
            {
                continue;
            }
            block_on(race(first, second));
            raced += 1;
        }
    }
    println!("state machine races: {raced} schedules");
    assert_eq!(raced, 27);
}
