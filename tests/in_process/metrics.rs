//! The metrics endpoint after a scripted scenario: one takeover, two stale
//! rejections, one reconcile claim, one job parked in manual review for a
//! known time (its timestamps set on the test data, no sleeping). Every
//! value is read back through the reference Prometheus text-format parser
//! and asserted exactly.

use jobfence_testkit as kit;

use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueRequest, FailDisposition, FailRequest,
    ObservationOutcome, ObservationSource, RecordObservationRequest,
};
use kit::ops::{drop_db, fresh_db, set_age, Coord};
use kit::secs;
use tonic::Code;

const Q: &str = "refunds";

fn claim(worker: &str) -> ClaimRequest {
    ClaimRequest {
        queue: Q.into(),
        worker_id: worker.into(),
        max_jobs: 1,
        lease: None,
        wait: None,
    }
}

fn enqueue(key: &str) -> EnqueueRequest {
    EnqueueRequest {
        queue: Q.into(),
        operation_key: key.into(),
        payload: "{}".into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    }
}

fn fail(job_id: u64, attempt: u64, d: FailDisposition) -> FailRequest {
    FailRequest {
        job_id,
        attempt,
        disposition: d as i32,
        error: "provider timeout".into(),
        retry_delay: secs(0),
        provider_retry_after: None,
        next: None,
    }
}

#[tokio::test]
async fn scripted_scenario_gives_exact_metric_values() {
    let (db, pool) = fresh_db().await;
    let mut c = Coord::start(&pool).await;
    let mut worker = c.worker().await;

    // Job A: claimed by worker-a (attempt 1, execute), its lease runs out,
    // worker-b's claim takes it over (attempt 2, reconcile).
    let a = worker
        .enqueue(enqueue("refund-a"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let first = worker.claim(claim("worker-a")).await.unwrap().into_inner();
    assert_eq!(first.jobs[0].job.as_ref().unwrap().attempt, 1);
    sqlx::query(
        "UPDATE jobs SET lease_until = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 SECOND) WHERE id = ?",
    )
    .bind(a.job_id)
    .execute(&pool)
    .await
    .unwrap();
    let taken = worker.claim(claim("worker-b")).await.unwrap().into_inner();
    assert!(taken.jobs[0].takeover);
    assert_eq!(taken.jobs[0].job.as_ref().unwrap().attempt, 2);

    // The zombie worker-a wakes up: two stale writes, both refused.
    let stale_complete = worker
        .complete(CompleteRequest {
            job_id: a.job_id,
            attempt: 1,
            provider_reference: "re_a".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap_err();
    let stale_fail = worker
        .fail(fail(a.job_id, 1, FailDisposition::RetryReconcile))
        .await
        .unwrap_err();
    for s in [&stale_complete, &stale_fail] {
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(kit::reason(s), "ATTEMPT_SUPERSEDED");
    }
    // worker-a keeps its late receipt as evidence; worker-b parks the job.
    worker
        .record_observation(RecordObservationRequest {
            job_id: a.job_id,
            attempt: 1,
            source: ObservationSource::Worker as i32,
            outcome: ObservationOutcome::Succeeded as i32,
            provider_reference: "re_a".into(),
            body: "{}".into(),
            dedup_key: "worker-a:re_a".into(),
        })
        .await
        .unwrap();
    worker
        .fail(fail(a.job_id, 2, FailDisposition::ManualReview))
        .await
        .unwrap();

    // Job B: running (claimed, execute). Then a claim that finds nothing.
    // Job C: ready and due.
    let b = worker
        .enqueue(enqueue("refund-b"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    worker.claim(claim("worker-c")).await.unwrap();
    let empty = worker.claim(claim("worker-c")).await.unwrap().into_inner();
    assert!(empty.jobs.is_empty());
    let cj = worker
        .enqueue(enqueue("refund-c"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();

    // Known ages, set on the test data: A parked 1 h ago and created 2 h
    // ago, B claimed 60 s ago, C due for 120 s.
    set_age(&pool, a.job_id, "updated_at", 3600).await;
    set_age(&pool, a.job_id, "created_at", 7200).await;
    set_age(&pool, b.job_id, "updated_at", 60).await;
    set_age(&pool, cj.job_id, "run_at", 120).await;
    c.refresh().await;

    let m = c.scrape().await;
    assert!(m.content_type().starts_with("text/plain; version=0.0.4"));
    let q = ("queue", Q);

    // Takeovers: one, by claim.
    assert_eq!(
        m.value("jobfence_takeovers_total", &[q, ("via", "claim")]),
        1.0
    );
    assert_eq!(
        m.get("jobfence_takeovers_total", &[q, ("via", "takeover")]),
        None
    );
    // Stale-attempt rejections: two, one per RPC.
    assert_eq!(
        m.value(
            "jobfence_stale_attempt_rejections_total",
            &[q, ("rpc", "Complete")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "jobfence_stale_attempt_rejections_total",
            &[q, ("rpc", "Fail")]
        ),
        1.0
    );
    assert_eq!(m.sum("jobfence_stale_attempt_rejections_total", &[q]), 2.0);
    // Claims by next_action: A and B executed, A's takeover reconciles.
    let reconcile = m.value(
        "jobfence_claimed_jobs_total",
        &[q, ("next_action", "reconcile")],
    );
    let execute = m.value(
        "jobfence_claimed_jobs_total",
        &[q, ("next_action", "execute")],
    );
    assert_eq!((reconcile, execute), (1.0, 2.0));
    assert_eq!(reconcile / (reconcile + execute), 1.0 / 3.0);
    assert_eq!(m.value("jobfence_empty_claims_total", &[q]), 1.0);
    // Oldest pending age per state, whole seconds.
    let age = |state| {
        m.value(
            "jobfence_oldest_pending_age_seconds",
            &[q, ("state", state)],
        )
    };
    assert_eq!(age("manual_review"), 3600.0);
    assert_eq!(age("running"), 60.0);
    assert_eq!(age("ready"), 120.0);
    assert_eq!(
        m.value("jobfence_oldest_unfinished_age_seconds", &[q]),
        7200.0
    );
    // Evidence and decisions.
    assert_eq!(
        m.value(
            "jobfence_observations_recorded_total",
            &[
                ("source", "worker"),
                ("outcome", "succeeded"),
                ("duplicate", "false")
            ]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "jobfence_manual_review_entered_total",
            &[q, ("reason", "REQUESTED")]
        ),
        1.0
    );
    assert_eq!(m.sum("jobfence_commit_outcome_unknown_total", &[]), 0.0);
    // RPC latency histograms, by method and status code.
    let svc = ("service", "jobfence.v1.JobCoordinator");
    let count = |method, code| {
        m.value(
            "jobfence_rpc_duration_seconds_count",
            &[svc, ("method", method), ("code", code)],
        )
    };
    assert_eq!(count("Claim", "OK"), 4.0);
    assert_eq!(count("Enqueue", "OK"), 3.0);
    assert_eq!(count("Complete", "FAILED_PRECONDITION"), 1.0);
    assert_eq!(count("Fail", "FAILED_PRECONDITION"), 1.0);
    assert_eq!(count("Fail", "OK"), 1.0);
    assert_eq!(count("RecordObservation", "OK"), 1.0);
    assert_eq!(
        m.value(
            "jobfence_rpc_duration_seconds_bucket",
            &[svc, ("method", "Claim"), ("code", "OK"), ("le", "+Inf")]
        ),
        4.0
    );
    // The pool: the test pool's configured maximum.
    assert_eq!(m.value("jobfence_db_pool_max_connections", &[]), 32.0);
    assert!(m
        .get("jobfence_db_pool_connections", &[("state", "in_use")])
        .is_some());
    // No refresh failed; the series exists from the start, at 0, so an
    // alert on its increase sees the first failure.
    assert_eq!(
        m.get(
            "jobfence_pending_age_refreshes_total",
            &[("result", "error")]
        ),
        Some(0.0)
    );
    assert_eq!(
        m.get("jobfence_commit_outcome_unknown_total", &[("rpc", "Claim")]),
        Some(0.0)
    );
    // HELP text on every family, and the type the name promises.
    for f in m.families() {
        let name = f["name"].as_str().unwrap();
        assert!(name.starts_with("jobfence_"), "{name}");
        assert!(
            !f["help"].as_str().unwrap().is_empty(),
            "{name} has no HELP"
        );
    }
    assert_eq!(m.family("jobfence_takeovers")["type"], "counter");
    assert_eq!(
        m.family("jobfence_oldest_pending_age_seconds")["type"],
        "gauge"
    );
    assert_eq!(
        m.family("jobfence_rpc_duration_seconds")["type"],
        "histogram"
    );

    // A parked job resolved by an operator leaves the gauge at 0.
    sqlx::query("UPDATE jobs SET state = 'failed', finished_at = UTC_TIMESTAMP(6) WHERE id = ?")
        .bind(a.job_id)
        .execute(&pool)
        .await
        .unwrap();
    c.refresh().await;
    let m = c.scrape().await;
    assert_eq!(
        m.value(
            "jobfence_oldest_pending_age_seconds",
            &[q, ("state", "manual_review")]
        ),
        0.0
    );
    c.stop().await;
    drop_db(db, pool).await;
}
