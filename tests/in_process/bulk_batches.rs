//! Repair in bulk, in batches (BulkRepair): 100,000 ready jobs cancelled
//! by `jobfence jobs bulk cancel` while 20 workers claim and complete from
//! the same queue leave each job cancelled or completed, never both, every
//! cancel under the operator's name; a batch stuck behind a held row lock
//! is rolled back by its lock wait timeout, run again, counted, and
//! applied once; jobs that moved between the count and their batch are
//! skipped with their reason and never overwritten; bad input is refused
//! as a whole, naming the field, with nothing written; only an operator
//! may call it, and each job's event names the credential's operator.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{
    self as proto, bulk_repair_result, BulkRepairRequest, ClaimRequest, CompleteRequest,
    CountedJob, FailDisposition, FailRequest, ObservationOutcome, ObservationSource,
    RecordObservationRequest, Resolution, ResolveManualReviewRequest,
};
use jobfence_domain::{Enqueue, JobState};
use jobfence_operator::{Bulk, Cli, JobsCommand, Operation};
use jobfence_store::PausePoint;
use kit::{reason, until, Harness};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

const Q: &str = "refunds";

/// `jobfence jobs ARGS…` against `h` (no TLS), parsed.
fn cli(h: &Harness, args: &[&str]) -> Operation {
    let endpoint = format!("http://{}", h.addr);
    let mut argv = vec!["jobfence", "jobs", "--endpoint", &endpoint];
    argv.extend_from_slice(args);
    Cli::try_parse_from(argv).unwrap().command
}

/// The bulk of `jobfence jobs bulk ARGS…`, ready to select and apply.
async fn bulk(h: &Harness, args: &[&str]) -> Bulk {
    let mut argv = vec!["bulk"];
    argv.extend_from_slice(args);
    let Operation::Jobs(jobs) = cli(h, &argv) else {
        panic!("not a jobs command");
    };
    let JobsCommand::Bulk(b) = jobs.command else {
        panic!("not bulk");
    };
    Bulk::connect(&jobs.conn, b).await.unwrap()
}

async fn admin(h: &Harness) -> JobAdminClient<Channel> {
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
}

/// `n` ready jobs of `queue` through the store's EnqueueBatch, a thousand
/// a transaction.
async fn seed(h: &Harness, queue: &str, n: u64) {
    let store = h.coordinator.store();
    for start in (0..n).step_by(1000) {
        let items: Vec<Enqueue> = (start..(start + 1000).min(n))
            .map(|k| Enqueue {
                queue: queue.into(),
                operation_key: format!("refund-{k}"),
                payload: format!("{{\"amount\":{k}}}"),
                delay: Duration::ZERO,
                fairness_key: None,
                priority: Default::default(),
            })
            .collect();
        for r in store.enqueue_batch(&items).await.unwrap() {
            assert!(r.unwrap().created);
        }
    }
}

/// One SQL count.
async fn count(h: &Harness, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&h.pool).await.unwrap()
}

/// A worker that claims one job at a time from `Q` and completes it, until
/// a claim finds nothing; how many it completed.
async fn worker(h: &Harness, w: usize) -> tokio::task::JoinHandle<u64> {
    let mut c = h.another_client().await;
    tokio::spawn(async move {
        let mut done = 0;
        loop {
            let claimed = c
                .claim(ClaimRequest {
                    queue: Q.into(),
                    worker_id: format!("worker-{w}"),
                    max_jobs: 1,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let Some(job) = claimed.jobs.into_iter().next().and_then(|j| j.job) else {
                return done;
            };
            c.complete(CompleteRequest {
                job_id: job.job_id,
                attempt: job.attempt,
                provider_reference: format!("re_{}", job.job_id),
                result: String::new(),
                next: None,
            })
            .await
            .unwrap();
            done += 1;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bulk_cancel_of_100_000_jobs_racing_20_workers_cancels_or_leaves_each_never_both() {
    const JOBS: i64 = 100_000;
    let h = Harness::start().await;
    let seeding = Instant::now();
    kit::load::ready_jobs(&h.pool, Q, "refund", JOBS as u64).await;
    eprintln!(
        "loaded {JOBS} ready jobs in {:.1} s",
        seeding.elapsed().as_secs_f64()
    );
    let mut workers = Vec::new();
    for w in 0..20 {
        workers.push(worker(&h, w).await);
    }
    let op = cli(
        &h,
        &[
            "--json",
            "bulk",
            "cancel",
            "--queue",
            Q,
            "--operator",
            "alice",
            "--reason",
            "incident 12",
            "--yes",
        ],
    );
    let started = Instant::now();
    let mut out = Vec::new();
    jobfence_operator::run(op, &mut out).await.unwrap();
    let took = started.elapsed();
    let mut completed = 0;
    for w in workers {
        completed += w.await.unwrap();
    }
    let summary: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let selected = summary["selected"].as_i64().unwrap();
    let applied = summary["applied"].as_i64().unwrap();
    let skipped: i64 = summary["skipped"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_i64().unwrap())
        .sum();
    eprintln!(
        "bulk cancel: {selected} jobs counted and sent in {:.1} s, {:.0} jobs a second \
         ({applied} cancelled, {skipped} skipped: {}); the workers completed {completed}",
        took.as_secs_f64(),
        selected as f64 / took.as_secs_f64(),
        summary["skipped"]
    );
    assert_eq!(summary["errors"], serde_json::json!({}), "{summary}");
    assert_eq!(applied + skipped, selected, "{summary}");
    let cancelled = count(&h, "SELECT COUNT(*) FROM jobs WHERE state = 'cancelled'").await;
    let succeeded = count(&h, "SELECT COUNT(*) FROM jobs WHERE state = 'succeeded'").await;
    assert_eq!((cancelled, succeeded), (applied, JOBS - applied));
    assert_eq!(succeeded as u64, completed);
    let both = count(
        &h,
        "SELECT COUNT(*) FROM (SELECT job_id FROM job_events WHERE kind IN ('cancelled', 'completed') \
         GROUP BY job_id HAVING COUNT(DISTINCT kind) > 1) AS both_kinds",
    )
    .await;
    assert_eq!(both, 0, "no job both cancelled and completed");
    let twice = count(
        &h,
        "SELECT COUNT(*) FROM (SELECT job_id FROM job_events WHERE kind IN ('cancelled', 'completed') \
         GROUP BY job_id HAVING COUNT(*) > 1) AS twice",
    )
    .await;
    assert_eq!(twice, 0, "no job cancelled or completed twice");
    let by_alice = count(
        &h,
        "SELECT COUNT(*) FROM job_events WHERE kind = 'cancelled' \
         AND JSON_VALUE(detail, '$.operator') = 'alice' AND JSON_VALUE(detail, '$.reason') = 'incident 12'",
    )
    .await;
    assert_eq!(by_alice, applied, "every cancel under the operator's name");
    let refused = count(
        &h,
        "SELECT COUNT(*) FROM job_events WHERE kind = 'cancel_rejected' \
         AND JSON_VALUE(detail, '$.operator') = 'alice'",
    )
    .await;
    assert_eq!(refused, skipped, "every skipped job's refusal recorded");
    h.finish().await;
}

fn observation(job_id: u64) -> RecordObservationRequest {
    RecordObservationRequest {
        job_id,
        attempt: 0,
        source: ObservationSource::Webhook as i32,
        outcome: ObservationOutcome::Pending as i32,
        provider_reference: String::new(),
        body: "{\"status\":\"pending\"}".into(),
        dedup_key: "webhook-1".into(),
    }
}

#[tokio::test]
async fn a_batch_behind_a_held_row_times_out_is_run_again_counted_and_applied_once() {
    let h = Harness::start_with_lock_wait(1).await;
    seed(&h, Q, 10).await;
    let mut bulk = bulk(
        &h,
        &[
            "cancel",
            "--queue",
            Q,
            "--operator",
            "alice",
            "--reason",
            "incident 12",
        ],
    )
    .await;
    let counted = bulk.select().await.unwrap();
    assert_eq!(counted.len(), 10);
    let held = counted[5].0;
    // A webhook's observation holds job 6's row lock, changing nothing the
    // cancel checks.
    let mut gate = h.pauses.arm(PausePoint::ObservationAfterLock);
    let mut webhook = h.another_client().await;
    let observed = tokio::spawn(async move { webhook.record_observation(observation(held)).await });
    gate.reached().await;
    let store = h.coordinator.store().clone();
    let (retried_before, _) = store.conflicts();
    // The batch locks jobs 1 to 5, waits for job 6 until its lock wait
    // times out (1205), and is rolled back and run again.
    let applying = tokio::spawn(async move {
        let tally = bulk.apply(&counted).await;
        (bulk, tally)
    });
    until("the batch's lock wait timed out and was run again", || {
        store.conflicts().0 > retried_before
    })
    .await;
    gate.release();
    observed
        .await
        .unwrap()
        .expect("the observation is recorded");
    let (_, tally) = applying.await.unwrap();
    assert_eq!((tally.applied, tally.selected), (10, 10), "{tally:?}");
    assert!(
        tally.skipped.is_empty() && tally.errors.is_empty(),
        "{tally:?}"
    );
    assert!(tally.conflicts_retried >= 1, "{tally:?}");
    let (retried, reported) = store.conflicts();
    assert_eq!(
        retried - retried_before,
        tally.conflicts_retried,
        "the conflicts counted are the batch's"
    );
    assert_eq!(reported, 0, "no conflict reached the operator");
    for i in 1..=10 {
        assert_eq!(h.row(i).await.state, JobState::Cancelled);
        assert_eq!(h.count_events(i, "cancelled").await, 1, "job {i} once");
        assert_eq!(h.count_events(i, "cancel_rejected").await, 0, "job {i}");
    }
    assert_eq!(h.count_events(held, "observation_recorded").await, 1);
    h.finish().await;
}

/// A job of `Q2` parked in manual review and requeued by bob, claimed
/// again and parked again: under a later attempt than the one counted.
async fn park_again(h: &Harness, job: &proto::Job) {
    admin(h)
        .await
        .resolve_manual_review(ResolveManualReviewRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            resolution: Resolution::RetryReconcile as i32,
            operator: "bob".into(),
            reason: "provider back".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let again = h.claim_one(Q2, "worker-b").await;
    assert_eq!((again.job_id, again.attempt), (job.job_id, job.attempt + 1));
    h.another_client()
        .await
        .fail(FailRequest {
            job_id: again.job_id,
            attempt: again.attempt,
            disposition: FailDisposition::ManualReview as i32,
            error: "provider says unknown".into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

const Q2: &str = "payouts";

#[tokio::test]
async fn jobs_that_moved_between_the_count_and_their_batch_are_skipped_never_overwritten() {
    let h = Harness::start().await;
    seed(&h, Q, 6).await;
    let mut cancel = bulk(
        &h,
        &[
            "cancel",
            "--queue",
            Q,
            "--operator",
            "alice",
            "--reason",
            "incident 12",
            "--batch-size",
            "4",
        ],
    )
    .await;
    let counted = cancel.select().await.unwrap();
    assert_eq!(counted.len(), 6);
    // After the count: one claimed, one claimed and completed, one
    // claimed and sent back to ready under a later attempt.
    let running = h.claim_one(Q, "worker-a").await;
    let finished = h.claim_one(Q, "worker-a").await;
    let retried = h.claim_one(Q, "worker-a").await;
    let mut w = h.another_client().await;
    w.complete(CompleteRequest {
        job_id: finished.job_id,
        attempt: finished.attempt,
        provider_reference: "re_1".into(),
        result: String::new(),
        next: None,
    })
    .await
    .unwrap();
    w.fail(FailRequest {
        job_id: retried.job_id,
        attempt: retried.attempt,
        disposition: FailDisposition::RetryReconcile as i32,
        error: "timeout".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let tally = cancel.apply(&counted).await;
    assert_eq!(tally.applied, 3, "{tally:?}");
    assert_eq!(
        tally.skipped.get("JOB_NOT_CANCELLABLE"),
        Some(&3),
        "{tally:?}"
    );
    assert!(tally.errors.is_empty(), "{tally:?}");
    let row = h.row(running.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 1));
    assert_eq!(h.row(finished.job_id).await.state, JobState::Succeeded);
    let row = h.row(retried.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Ready, 1));
    for moved in [running.job_id, finished.job_id, retried.job_id] {
        assert_eq!(h.count_events(moved, "cancelled").await, 0);
        assert_eq!(h.count_events(moved, "cancel_rejected").await, 1);
        // The refusal keeps the attempt the count saw.
        assert!(h
            .events(moved)
            .await
            .contains(&("cancel_rejected".into(), 0, 1)));
    }

    // Parked jobs: one resolved by bob after the count, one parked again
    // under a later attempt, one as counted.
    let parked: Vec<proto::Job> = vec![
        h.parked(Q2, "payout-1").await,
        h.parked(Q2, "payout-2").await,
        h.parked(Q2, "payout-3").await,
    ];
    let mut requeue = bulk(
        &h,
        &[
            "requeue",
            "--queue",
            Q2,
            "--operator",
            "alice",
            "--reason",
            "provider back",
        ],
    )
    .await;
    let counted = requeue.select().await.unwrap();
    assert_eq!(counted.len(), 3);
    admin(&h)
        .await
        .resolve_manual_review(ResolveManualReviewRequest {
            job_id: parked[0].job_id,
            attempt: parked[0].attempt,
            resolution: Resolution::Failed as i32,
            operator: "bob".into(),
            reason: "checked the dashboard".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    park_again(&h, &parked[1]).await;
    let tally = requeue.apply(&counted).await;
    assert_eq!(tally.applied, 1, "{tally:?}");
    assert_eq!(tally.skipped.get("JOB_NOT_IN_MANUAL_REVIEW"), Some(&1));
    assert_eq!(tally.skipped.get("ATTEMPT_SUPERSEDED"), Some(&1));
    assert_eq!(h.row(parked[0].job_id).await.state, JobState::Failed);
    let again = h.row(parked[1].job_id).await;
    assert_eq!(
        (again.state, again.attempt),
        (JobState::ManualReview, parked[1].attempt + 1),
        "parked again, not requeued over"
    );
    assert_eq!(h.row(parked[2].job_id).await.state, JobState::Ready);
    for (job, rejected) in [(&parked[0], 1), (&parked[1], 1), (&parked[2], 0)] {
        assert_eq!(
            h.count_events(job.job_id, "resolve_rejected").await,
            rejected
        );
    }
    h.finish().await;
}

/// The fields an INVALID_REQUEST refusal names, in order.
fn violations(status: &tonic::Status) -> Vec<String> {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(status), "INVALID_REQUEST");
    status
        .get_details_bad_request()
        .expect("BadRequest detail")
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect()
}

#[tokio::test]
async fn bad_input_is_refused_whole_naming_the_field_and_writes_nothing() {
    let h = Harness::start().await;
    seed(&h, Q, 3).await;
    let jobs = |ids: &[u64]| -> Vec<CountedJob> {
        ids.iter()
            .map(|&job_id| CountedJob { job_id, attempt: 0 })
            .collect()
    };
    let good = BulkRepairRequest {
        action: proto::BulkAction::Cancel as i32,
        jobs: jobs(&[1, 2, 3]),
        operator: "alice".into(),
        reason: "incident 12".into(),
    };
    let many: Vec<u64> = (1..=1001).collect();
    let cases = [
        (
            BulkRepairRequest {
                operator: String::new(),
                ..good.clone()
            },
            "operator",
        ),
        (
            BulkRepairRequest {
                reason: String::new(),
                ..good.clone()
            },
            "reason",
        ),
        (
            BulkRepairRequest {
                action: 0,
                ..good.clone()
            },
            "action",
        ),
        (
            BulkRepairRequest {
                action: 9,
                ..good.clone()
            },
            "action",
        ),
        (
            BulkRepairRequest {
                jobs: jobs(&[1, 2, 1]),
                ..good.clone()
            },
            "jobs[2].job_id",
        ),
        (
            BulkRepairRequest {
                jobs: jobs(&[1, 0]),
                ..good.clone()
            },
            "jobs[1].job_id",
        ),
        (
            BulkRepairRequest {
                jobs: vec![],
                ..good.clone()
            },
            "jobs",
        ),
        (
            BulkRepairRequest {
                jobs: jobs(&many),
                ..good.clone()
            },
            "jobs",
        ),
        (
            BulkRepairRequest {
                action: proto::BulkAction::Fail as i32,
                ..good.clone()
            },
            "jobs[0].attempt",
        ),
    ];
    let mut a = admin(&h).await;
    for (request, field) in cases {
        let status = a.bulk_repair(request).await.unwrap_err();
        let fields = violations(&status);
        assert_eq!(
            fields.first().map(String::as_str),
            Some(field),
            "{status:?}"
        );
    }
    let events = count(
        &h,
        "SELECT COUNT(*) FROM job_events WHERE kind <> 'enqueued'",
    )
    .await;
    assert_eq!(events, 0, "nothing written");
    let ready = count(&h, "SELECT COUNT(*) FROM jobs WHERE state = 'ready'").await;
    assert_eq!(ready, 3);
    // The same call made good applies, and answers each job in order.
    let done = a.bulk_repair(good.clone()).await.unwrap().into_inner();
    assert_eq!((done.applied, done.skipped), (3, 0));
    let ids: Vec<u64> = done.results.iter().map(|r| r.job_id).collect();
    assert_eq!(ids, [1, 2, 3]);
    // Sent again (its answer lost): each job a replay, nothing written.
    let again = a.bulk_repair(good).await.unwrap().into_inner();
    assert_eq!((again.applied, again.skipped), (3, 0));
    for r in &again.results {
        let Some(bulk_repair_result::Result::Applied(applied)) = &r.result else {
            panic!("{r:?}");
        };
        assert!(applied.replayed, "{r:?}");
        assert_eq!(applied.state, proto::JobState::Cancelled as i32);
    }
    for id in 1..=3 {
        assert_eq!(h.count_events(id, "cancelled").await, 1);
        assert_eq!(h.count_events(id, "cancel_rejected").await, 0);
    }
    h.finish().await;
}

#[tokio::test]
async fn only_an_operator_repairs_in_bulk_and_each_job_records_the_credentials_name() {
    let s = kit::secure::Secure::start(false).await;
    let mut w = s.worker(Some("refunds-worker")).await;
    let mut ids = Vec::new();
    for key in ["refund-1", "refund-2"] {
        let made = w
            .enqueue(proto::EnqueueRequest {
                queue: "refunds".into(),
                operation_key: key.into(),
                payload: "{}".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        ids.push(made.job.unwrap().job_id);
    }
    let request = |operator: &str| BulkRepairRequest {
        action: proto::BulkAction::Cancel as i32,
        jobs: ids
            .iter()
            .map(|&job_id| CountedJob { job_id, attempt: 0 })
            .collect(),
        operator: operator.into(),
        reason: "incident 12".into(),
    };
    let before = s.counts().await;
    let mut as_worker = s.admin(Some("refunds-worker")).await;
    let status = as_worker
        .bulk_repair(request("refunds-worker"))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), reason(&status)),
        (Code::PermissionDenied, "ROLE_NOT_ALLOWED".into())
    );
    assert_eq!(kit::meta(&status, "required_role"), "operator");
    let mut alice = s.admin(Some("alice")).await;
    let status = alice.bulk_repair(request("bob")).await.unwrap_err();
    assert_eq!(reason(&status), "OPERATOR_MISMATCH");
    assert_eq!(s.counts().await, before, "nothing written");
    let done = alice.bulk_repair(request("")).await.unwrap().into_inner();
    assert_eq!(done.applied, 2);
    let operators: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(JSON_VALUE(detail, '$.operator') AS CHAR) FROM job_events \
         WHERE kind = 'cancelled' ORDER BY job_id",
    )
    .fetch_all(&s.pool)
    .await
    .unwrap();
    assert_eq!(operators, ["alice", "alice"]);
    s.stop().await;
}
