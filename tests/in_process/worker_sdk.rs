//! The Rust worker SDK against the real coordinator and MariaDB: handles,
//! typed refusals, replays, unclear claims and the runner. Every race is
//! scheduled by pause points, a proxy that loses answers on demand, or a
//! barrier; never by a sleep.

use jobfence_testkit as kit;

use jobfence_domain::{JobState, NextAction as DomainAction};
use jobfence_worker::proto::{self, NextAction, ObservationOutcome, ObservationSource};
use jobfence_worker::{
    observation_dedup_key, ClaimError, ClaimedJob, Disposition, Handler, HandlerError, Worker,
    WorkerClient, WriteError,
};
use kit::sdk::{config, observations, sdk, Proxy};
use kit::Harness;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Barrier, Notify};

const Q: &str = "refunds";

async fn claim_one(client: &WorkerClient) -> ClaimedJob {
    let mut jobs = client.claim(1).await.expect("claim");
    assert_eq!(jobs.len(), 1, "expected one claimable job");
    jobs.remove(0)
}

#[tokio::test]
async fn a_handle_completes_the_job_it_holds() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-pay_1-500-TWD", "{}").await;
    let a = sdk(&h, config("worker-a", Q)).await;
    let mut job = claim_one(&a).await;
    assert_eq!(job.job_id(), enqueued.job_id);
    assert_eq!(job.attempt(), 1);
    assert_eq!(job.operation_key(), "refund-pay_1-500-TWD");
    assert_eq!(job.next_action(), NextAction::Execute);
    assert!(!job.is_takeover() && !job.is_settled());

    let written = job
        .complete("re_1", r#"{"status":"succeeded"}"#)
        .await
        .expect("the holder completes");
    assert!(!written.replayed);
    assert_eq!(written.job.state(), proto::JobState::Succeeded);
    assert!(job.is_settled());
    let row = h.row(enqueued.job_id).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.attempt, 1);
    assert_eq!(row.provider_reference.as_deref(), Some("re_1"));
    assert_eq!(row.lease_owner.as_deref(), Some("worker-a"));
    assert!(observations(&h, enqueued.job_id).await.is_empty());
    h.finish().await;
}

#[tokio::test]
async fn a_stale_handle_is_superseded_and_its_provider_result_becomes_an_observation() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-stale", "{}").await;
    let a = sdk(&h, config("worker-a", Q)).await;
    let b = sdk(&h, config("worker-b", Q)).await;
    let mut stale = claim_one(&a).await;

    // A stalls at the provider; its lease runs out (forced) and B takes over.
    h.force_lease_expired(enqueued.job_id).await;
    let mut current = b.takeover(enqueued.job_id).await.expect("B takes over");
    assert_eq!(current.attempt(), 2);
    assert!(current.is_takeover());
    assert_eq!(current.next_action(), NextAction::Reconcile);
    assert_eq!(current.operation_key(), stale.operation_key());

    // A finally hears "refund succeeded": the write is refused, the
    // evidence is kept.
    let body = r#"{"id":"re_A","status":"succeeded"}"#;
    match stale.complete("re_A", body).await {
        Err(WriteError::Superseded {
            current_attempt: 2,
            current_state: proto::JobState::Running,
            observation_recorded: true,
        }) => {}
        other => panic!("expected Superseded with the observation recorded, got {other:?}"),
    }
    assert!(stale.is_settled());
    let seen = observations(&h, enqueued.job_id).await;
    assert_eq!(seen.len(), 1);
    let o = &seen[0];
    assert_eq!(o.attempt, 1);
    assert_eq!(o.source, ObservationSource::Worker as i32);
    assert_eq!(o.outcome, ObservationOutcome::Succeeded as i32);
    assert_eq!(o.provider_reference, "re_A");
    assert_eq!(o.body, body);
    assert_eq!(o.dedup_key, observation_dedup_key("worker-a", "re_A"));

    // Every other write of A is refused the same way, and records nothing.
    for refusal in [
        stale
            .fail(
                Disposition::RetryReconcile,
                "socket timeout",
                Duration::ZERO,
            )
            .await
            .unwrap_err(),
        stale
            .renew_lease(Duration::from_secs(30))
            .await
            .unwrap_err(),
    ] {
        assert!(
            matches!(
                refusal,
                WriteError::Superseded {
                    current_attempt: 2,
                    observation_recorded: false,
                    ..
                }
            ),
            "{refusal:?}"
        );
    }
    let row = h.row(enqueued.job_id).await;
    assert_eq!(row.state, JobState::Running);
    assert_eq!(row.attempt, 2);
    assert_eq!(row.lease_owner.as_deref(), Some("worker-b"));
    assert_eq!(row.provider_reference, None);

    // B reconciles, sees the evidence, and completes with its attempt.
    current
        .complete("re_A", body)
        .await
        .expect("the holder completes");
    // A repeats its late result: still refused, the observation not doubled.
    match stale.complete("re_A", body).await {
        Err(WriteError::Superseded {
            current_state: proto::JobState::Succeeded,
            observation_recorded: true,
            ..
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(observations(&h, enqueued.job_id).await.len(), 1);
    assert_eq!(h.count_events(enqueued.job_id, "completed").await, 1);
    assert_eq!(
        h.count_events(enqueued.job_id, "stale_write_rejected")
            .await,
        4
    );
    h.finish().await;
}

#[tokio::test]
async fn an_identical_write_again_is_reported_as_a_replay() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-replay", "{}").await;
    h.enqueue(Q, "refund-replay-fail", "{}").await;
    let a = sdk(&h, config("worker-a", Q)).await;
    let mut job = claim_one(&a).await;
    assert!(!job.complete("re_r", "ok").await.unwrap().replayed);
    let again = job.complete("re_r", "ok").await.expect("a replay is OK");
    assert!(again.replayed);
    assert_eq!(again.job.provider_reference, "re_r");
    // A different write by the same attempt is not a replay: the job is
    // done, and the new provider result is kept as evidence.
    match job.complete("re_other", "ok").await {
        Err(WriteError::NotRunning {
            state: proto::JobState::Succeeded,
            observation_recorded: true,
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.count_events(job.job_id(), "completed").await, 1);

    let mut other = claim_one(&a).await;
    let first = other
        .fail(
            Disposition::RetryReconcile,
            "timeout",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(first.applied, Disposition::RetryReconcile);
    assert_eq!(first.override_reason, None);
    assert_eq!(first.job.state(), proto::JobState::Ready);
    let replay = other
        .fail(
            Disposition::RetryReconcile,
            "timeout",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(replay.replayed && !first.replayed);
    // An invalid write is refused with its field violations; nothing changes.
    let mut third = {
        h.enqueue(Q, "refund-invalid", "{}").await;
        claim_one(&a).await
    };
    match third.fail(Disposition::Failed, "", Duration::ZERO).await {
        Err(WriteError::Invalid(bad)) => {
            assert!(bad.field_violations.iter().any(|v| v.field == "error"))
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!third.is_settled());
    assert_eq!(h.row(third.job_id()).await.state, JobState::Running);
    h.finish().await;
}

#[tokio::test]
async fn a_complete_whose_answer_was_lost_is_retried_and_reported_as_a_replay() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-lost-answer", "{}").await;
    let proxy = Proxy::start(h.addr).await;
    let a = WorkerClient::connect(format!("http://{}", proxy.addr), config("worker-a", Q))
        .await
        .unwrap();
    let mut job = claim_one(&a).await;

    // The coordinator commits the Complete, but its answer never arrives.
    proxy.swallow_responses(true);
    let call = tokio::spawn(async move {
        let out = job.complete("re_L", "ok").await;
        (job, out)
    });
    kit::sdk::wait_for_row(&h, enqueued.job_id, "succeeded", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    // Cut first: the answer may still be on its way, and must be lost.
    proxy.cut();
    proxy.swallow_responses(false);

    // The SDK sends the same call again and is told it had been applied.
    let (job, out) = call.await.unwrap();
    let written = out.expect("the retried Complete is answered as a replay");
    assert!(written.replayed);
    assert!(job.is_settled());
    assert_eq!(h.count_events(enqueued.job_id, "completed").await, 1);
    assert_eq!(
        h.row(enqueued.job_id).await.provider_reference.as_deref(),
        Some("re_L")
    );
    h.finish().await;
}

#[tokio::test]
async fn a_claim_whose_commit_was_lost_hands_out_nothing() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-lost-commit", "{}").await;
    let a = sdk(&h, config("worker-a", Q)).await;
    let mut paused = h.pauses.arm(jobfence_store::PausePoint::ClaimBeforeCommit);
    let claim = tokio::spawn(async move { a.claim(1).await });
    paused.reached().await;
    // The claim's connection dies just before its COMMIT.
    kit::sdk::kill_the_paused_session(&h, &paused).await;
    paused.release();
    match claim.await.unwrap() {
        Err(ClaimError::OutcomeUnknown(status)) => {
            assert_eq!(kit::reason(&status), "COMMIT_OUTCOME_UNKNOWN")
        }
        other => panic!("expected an unknown outcome and no handle, got {other:?}"),
    }
    // The kill rolled the claim back; nobody must have assumed otherwise.
    let row = h.row(enqueued.job_id).await;
    assert_eq!(row.state, JobState::Ready);
    assert_eq!(row.attempt, 0);
    h.finish().await;
}

#[tokio::test]
async fn a_claim_committed_but_unanswered_hands_out_nothing_and_comes_back_to_reconcile() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-unanswered-claim", "{}").await;
    let proxy = Proxy::start(h.addr).await;
    let a = WorkerClient::connect(format!("http://{}", proxy.addr), config("worker-a", Q))
        .await
        .unwrap();
    proxy.swallow_responses(true);
    let claim = tokio::spawn(async move { a.claim(1).await });
    kit::sdk::wait_for_row(&h, enqueued.job_id, "claimed", |j| {
        j.state == JobState::Running
    })
    .await;
    proxy.cut();
    assert!(
        matches!(claim.await.unwrap(), Err(ClaimError::OutcomeUnknown(_))),
        "no handle for a claim nobody heard back from"
    );
    // It did commit: attempt 1 is held by nobody. It is not retried or
    // inferred from this row; it comes back once its lease runs out, and
    // the takeover starts by reconciling.
    let row = h.row(enqueued.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 1));
    let b = sdk(&h, config("worker-b", Q)).await;
    assert!(b.claim(1).await.unwrap().is_empty(), "the lease is live");
    h.force_lease_expired(enqueued.job_id).await;
    let job = claim_one(&b).await;
    assert_eq!(job.attempt(), 2);
    assert!(job.is_takeover());
    assert_eq!(job.next_action(), NextAction::Reconcile);
    assert_eq!(
        h.row(enqueued.job_id).await.next_action,
        DomainAction::Reconcile
    );
    h.finish().await;
}

#[tokio::test]
async fn a_coordinator_that_cannot_be_reached_hands_out_nothing() {
    // A port that was just free: nothing listens there.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{closed}"))
        .unwrap()
        .connect_lazy();
    let client = WorkerClient::new(channel, config("worker-a", Q)).unwrap();
    assert!(matches!(
        client.claim(1).await,
        Err(ClaimError::OutcomeUnknown(_))
    ));
}

/// Counts calls and completes.
struct Counting(Arc<AtomicU32>);

impl Handler for Counting {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        job.complete("re_counted", "ok").await?;
        Ok(())
    }
}

#[tokio::test]
async fn the_runner_never_runs_a_handler_for_a_claim_it_did_not_hear_back_from() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-runner-unclear", "{}").await;
    let proxy = Proxy::start(h.addr).await;
    let client = WorkerClient::connect(format!("http://{}", proxy.addr), config("worker-a", Q))
        .await
        .unwrap();
    proxy.swallow_responses(true);
    let ran = Arc::new(AtomicU32::new(0));
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = tokio::spawn({
        let ran = ran.clone();
        async move {
            Worker::new(client)
                .run(Counting(ran), async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    // Its claim commits, the answer is lost; it is stopped meanwhile.
    kit::sdk::wait_for_row(&h, enqueued.job_id, "claimed", |j| {
        j.state == JobState::Running
    })
    .await;
    let _ = stop.send(());
    proxy.cut();
    let report = runner.await.unwrap();
    // Its claim is either reported unclear (the transport failed first) or
    // cut short by the stop signal while waiting for its answer.
    assert_eq!(
        report.unclear_claims + report.interrupted_claims,
        1,
        "{report:?}"
    );
    assert_eq!((report.claimed, report.handled), (0, 0), "{report:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");
    let row = h.row(enqueued.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 1));
    h.finish().await;
}

/// Records how many handlers run at once and how many jobs are held, then
/// waits at a barrier of `max_in_flight` before completing.
struct Gauge {
    pool: sqlx::MySqlPool,
    limit: i64,
    now: AtomicU32,
    max: AtomicU32,
    over_held: AtomicBool,
    barrier: Barrier,
    done: AtomicU32,
    total: u32,
    all_done: Arc<Notify>,
}

impl Handler for Gauge {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        // Never hoard: jobs held (running rows) never exceed the slots.
        if kit::sdk::running_rows(&self.pool).await > self.limit {
            self.over_held.store(true, Ordering::SeqCst);
        }
        // Only passes once `max_in_flight` handlers are in flight together.
        self.barrier.wait().await;
        let reference = format!("re_{}", job.job_id());
        job.complete(&reference, "ok").await?;
        self.now.fetch_sub(1, Ordering::SeqCst);
        if self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.total {
            self.all_done.notify_one();
        }
        Ok(())
    }
}

#[tokio::test]
async fn the_runner_handles_every_job_with_at_most_max_in_flight_at_once() {
    const SLOTS: u32 = 3;
    const JOBS: u32 = 9; // a multiple of SLOTS: every barrier generation fills
    let h = Harness::start().await;
    for i in 0..JOBS {
        h.enqueue(Q, &format!("refund-many-{i}"), "{}").await;
    }
    let mut cfg = config("worker-a", Q);
    cfg.max_in_flight = SLOTS;
    let client = sdk(&h, cfg).await;
    let all_done = Arc::new(Notify::new());
    let gauge = Gauge {
        pool: h.pool.clone(),
        limit: i64::from(SLOTS),
        now: AtomicU32::new(0),
        max: AtomicU32::new(0),
        over_held: AtomicBool::new(false),
        barrier: Barrier::new(SLOTS as usize),
        done: AtomicU32::new(0),
        total: JOBS,
        all_done: all_done.clone(),
    };
    let gauge = Arc::new(gauge);
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        Worker::new(client).run(
            Shared(gauge.clone()),
            async move { all_done.notified().await },
        ),
    )
    .await
    .expect("the runner handles every job (a stuck barrier means fewer slots were used)");
    assert_eq!(gauge.max.load(Ordering::SeqCst), SLOTS);
    assert!(
        !gauge.over_held.load(Ordering::SeqCst),
        "held more jobs than slots"
    );
    assert_eq!(report.claimed, u64::from(JOBS));
    // The first Claim fills the slots; every later job came with the
    // Complete that freed its slot (docs/design.md rule 16).
    assert_eq!(report.on_write_back, u64::from(JOBS - SLOTS));
    assert_eq!(report.handled, u64::from(JOBS));
    assert_eq!((report.released, report.abandoned), (0, 0));
    let done: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'succeeded'")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(done, i64::from(JOBS));
    h.finish().await;
}

/// A handler shared with the test.
struct Shared<H>(Arc<H>);

impl<H: Handler> Handler for Shared<H> {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        self.0.handle(job).await
    }
}

/// Tells the test it started, then waits for its go before completing.
struct Gated {
    started: std::sync::Mutex<Option<oneshot::Sender<u64>>>,
    go: tokio::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Handler for Gated {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        if let Some(tx) = self.started.lock().unwrap().take() {
            let _ = tx.send(job.job_id());
        }
        let go = self.go.lock().await.take();
        match go {
            Some(go) => go.await?,
            None => std::future::pending::<()>().await,
        }
        job.complete("re_gated", "ok").await?;
        Ok(())
    }
}

fn gated() -> (Gated, oneshot::Receiver<u64>, oneshot::Sender<()>) {
    let (started_tx, started) = oneshot::channel();
    let (go, go_rx) = oneshot::channel();
    let handler = Gated {
        started: std::sync::Mutex::new(Some(started_tx)),
        go: tokio::sync::Mutex::new(Some(go_rx)),
    };
    (handler, started, go)
}

#[tokio::test]
async fn shutdown_lets_the_handler_in_flight_finish_and_claims_nothing_more() {
    let h = Harness::start().await;
    let first = h.enqueue(Q, "refund-in-flight", "{}").await;
    // One slot: while the handler runs the runner only waits for the slot,
    // with no Claim in flight that could still pick up later work.
    let client = sdk(&h, config("worker-a", Q)).await;
    let (handler, started, go) = gated();
    let (stop, stopped) = oneshot::channel::<()>();
    // The run loop by its name on the client (the same loop as Worker::run).
    let runner = tokio::spawn(async move {
        client
            .run(handler, async {
                let _ = stopped.await;
            })
            .await
    });
    assert_eq!(started.await.unwrap(), first.job_id);
    stop.send(()).unwrap();
    // Work that arrives after the signal is not taken, though the slot frees.
    let later = h.enqueue(Q, "refund-after-shutdown", "{}").await;
    go.send(()).unwrap();
    let report = runner.await.unwrap();
    assert_eq!(report.claimed, 1, "{report:?}");
    assert_eq!(report.handled, 1);
    assert_eq!(report.abandoned, 0);
    assert_eq!(h.row(first.job_id).await.state, JobState::Succeeded);
    let row = h.row(later.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Ready, 0));
    h.finish().await;
}

#[tokio::test]
async fn a_handler_still_running_after_the_grace_is_abandoned_and_its_job_stays_leased() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-stuck", "{}").await;
    let mut cfg = config("worker-a", Q);
    cfg.shutdown_grace = Duration::from_millis(100);
    let client = sdk(&h, cfg).await;
    let (handler, started, _never) = gated(); // the handler waits forever
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = tokio::spawn(async move {
        Worker::new(client)
            .run(handler, async {
                let _ = stopped.await;
            })
            .await
    });
    started.await.unwrap();
    stop.send(()).unwrap();
    let report = runner.await.unwrap();
    assert_eq!(report.abandoned, 1, "{report:?}");
    assert_eq!(report.handled, 0);
    // Fenced, not lost: held by attempt 1 until a takeover reconciles it.
    let row = h.row(job.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 1));
    h.finish().await;
}

/// Fails without writing back.
struct GivesUp(Arc<Notify>);

impl Handler for GivesUp {
    async fn handle(&self, _job: &mut ClaimedJob) -> Result<(), HandlerError> {
        self.0.notify_one();
        Err("provider timed out".into())
    }
}

#[tokio::test]
async fn a_job_left_unsettled_by_its_handler_is_released_to_reconcile() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-gives-up", "{}").await;
    let client = sdk(&h, config("worker-a", Q)).await;
    let returned = Arc::new(Notify::new());
    let stop = returned.clone();
    let report = Worker::new(client)
        .run(GivesUp(returned), async move { stop.notified().await })
        .await;
    assert_eq!(report.handled, 1, "{report:?}");
    assert_eq!((report.handler_errors, report.released), (1, 1));
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Ready);
    assert_eq!(
        row.next_action,
        DomainAction::Reconcile,
        "never a blind resend"
    );
    assert!(row.last_error.unwrap().contains("provider timed out"));
    h.finish().await;
}

#[tokio::test]
async fn complete_or_observe_keeps_the_evidence_when_the_outcome_is_unknown() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-or-observe", "{}").await;
    let proxy = Proxy::start(h.addr).await;
    let mut cfg = config("worker-a", Q);
    cfg.retry.budget = Duration::ZERO; // so the lost answer stays unknown
    let a = WorkerClient::connect(format!("http://{}", proxy.addr), cfg)
        .await
        .unwrap();
    let mut job = claim_one(&a).await;
    assert!(matches!(
        job.complete_or_observe("", "ok").await,
        Err(WriteError::Invalid(_))
    ));

    proxy.swallow_responses(true);
    let call = tokio::spawn(async move {
        let out = job.complete_or_observe("re_O", "ok").await;
        (job, out)
    });
    kit::sdk::wait_for_row(&h, enqueued.job_id, "succeeded", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    proxy.cut();
    proxy.swallow_responses(false);
    let (job, out) = call.await.unwrap();
    assert!(matches!(out, Err(WriteError::OutcomeUnknown(_))), "{out:?}");
    assert!(!job.is_settled(), "the handle cannot know it is done");
    // It landed after all, and the evidence is on record either way.
    let seen = observations(&h, enqueued.job_id).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].dedup_key, observation_dedup_key("worker-a", "re_O"));
    assert_eq!(h.row(enqueued.job_id).await.state, JobState::Succeeded);
    h.finish().await;
}

/// The SDK's reason names (from the API crate, never the coordinator's
/// code) must be exactly the coordinator's.
#[test]
fn the_sdk_reason_names_are_the_coordinators() {
    use jobfence_server::grpc::status::{reason as server, ERROR_DOMAIN};
    use jobfence_worker::reason as sdk;
    assert_eq!(sdk::ERROR_DOMAIN, ERROR_DOMAIN);
    let pairs = [
        (sdk::INVALID_REQUEST, server::INVALID_REQUEST),
        (sdk::JOB_NOT_FOUND, server::JOB_NOT_FOUND),
        (sdk::ATTEMPT_SUPERSEDED, server::ATTEMPT_SUPERSEDED),
        (sdk::ATTEMPT_NOT_ISSUED, server::ATTEMPT_NOT_ISSUED),
        (sdk::JOB_NOT_RUNNING, server::JOB_NOT_RUNNING),
        (sdk::JOB_FINISHED, server::JOB_FINISHED),
        (sdk::LEASE_NOT_EXPIRED, server::LEASE_NOT_EXPIRED),
        (sdk::OPERATION_KEY_CONFLICT, server::OPERATION_KEY_CONFLICT),
        (
            sdk::JOB_NOT_IN_MANUAL_REVIEW,
            server::JOB_NOT_IN_MANUAL_REVIEW,
        ),
        (sdk::JOB_NOT_CANCELLABLE, server::JOB_NOT_CANCELLABLE),
        (sdk::COMMIT_OUTCOME_UNKNOWN, server::COMMIT_OUTCOME_UNKNOWN),
        (sdk::DATABASE_UNAVAILABLE, server::DATABASE_UNAVAILABLE),
        (sdk::TRANSACTION_CONFLICT, server::TRANSACTION_CONFLICT),
        (sdk::INTERNAL, server::INTERNAL),
        (sdk::OVERLOADED, server::OVERLOADED),
        (sdk::SERVER_SHUTTING_DOWN, server::SERVER_SHUTTING_DOWN),
        (sdk::NO_COORDINATOR_SERVING, server::NO_COORDINATOR_SERVING),
        (sdk::CREDENTIAL_MISSING, server::CREDENTIAL_MISSING),
        (sdk::CREDENTIAL_INVALID, server::CREDENTIAL_INVALID),
        (sdk::CREDENTIAL_EXPIRED, server::CREDENTIAL_EXPIRED),
        (sdk::ROLE_NOT_ALLOWED, server::ROLE_NOT_ALLOWED),
        (sdk::QUEUE_NOT_ALLOWED, server::QUEUE_NOT_ALLOWED),
        (sdk::OPERATOR_MISMATCH, server::OPERATOR_MISMATCH),
        (
            sdk::PROVIDER_BUDGET_EXHAUSTED,
            server::PROVIDER_BUDGET_EXHAUSTED,
        ),
        (sdk::PROVIDER_PAUSED, server::PROVIDER_PAUSED),
        (sdk::PROVIDER_THROTTLED, server::PROVIDER_THROTTLED),
        (sdk::JOB_PRUNED, server::JOB_PRUNED),
        (sdk::EVENTS_CURSOR_PRUNED, server::EVENTS_CURSOR_PRUNED),
        (
            sdk::SETTLEMENT_EXCEPTION_NOT_FOUND,
            server::SETTLEMENT_EXCEPTION_NOT_FOUND,
        ),
        (
            sdk::SETTLEMENT_EXCEPTION_MOVED,
            server::SETTLEMENT_EXCEPTION_MOVED,
        ),
    ];
    for (mine, theirs) in pairs {
        assert_eq!(mine, theirs);
    }
    // And no reason the coordinator sends is missing from the SDK: the
    // values of the enum ErrorReason (errors.proto), which the server's
    // status mapping names, are exactly these.
    let mut declared: Vec<&str> = jobfence_api::v1::ErrorReason::ALL
        .iter()
        .map(|r| r.as_str_name())
        .collect();
    declared.sort_unstable();
    let mut all = sdk::ALL.to_vec();
    all.sort_unstable();
    assert_eq!(all, declared, "jobfence_worker::reason::ALL");
    assert_eq!(pairs.len(), declared.len());
}
