//! Repair in bulk (`jobfence jobs bulk cancel|fail|requeue`): each job
//! through its own fenced write on the attempt the listing saw. A bulk
//! cancel racing 20 workers leaves every job cancelled or completed, never
//! both, and its counts add up; a bulk resolve skips the job another
//! operator resolved after the listing; and the bad input (no filter, an
//! unknown queue or reason code, more than --max without --yes) is refused
//! before anything is written, as is everything under --dry-run.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_api::v1::{CompleteRequest, Resolution, ResolveManualReviewRequest};
use jobfence_domain::JobState;
use jobfence_operator::{Bulk, Cli, JobsCommand, Operation};
use kit::Harness;

const Q: &str = "refunds";

/// `jobfence jobs ARGS…` against `h` (no TLS): the bulk arguments parsed.
fn parse(
    h: &Harness,
    args: &[&str],
) -> (jobfence_operator::Connection, jobfence_operator::BulkArgs) {
    let endpoint = format!("http://{}", h.addr);
    let mut argv = vec!["jobfence", "jobs", "--endpoint", &endpoint, "bulk"];
    argv.extend_from_slice(args);
    let Operation::Jobs(jobs) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not a jobs command");
    };
    let JobsCommand::Bulk(b) = jobs.command else {
        panic!("not bulk");
    };
    (jobs.conn, b)
}

/// Runs `jobfence jobs bulk ARGS…` whole; what it printed, or its error.
async fn run(h: &Harness, args: &[&str]) -> Result<String, String> {
    let endpoint = format!("http://{}", h.addr);
    let mut argv = vec!["jobfence", "jobs", "--endpoint", &endpoint, "bulk"];
    argv.extend_from_slice(args);
    let op = Cli::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .command;
    let mut out = Vec::new();
    let done = jobfence_operator::run(op, &mut out).await;
    let printed = String::from_utf8(out).unwrap();
    done.map(|_| printed).map_err(|e| format!("{e:#}"))
}

async fn states(h: &Harness) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT CAST(state AS CHAR), COUNT(*) FROM jobs GROUP BY state ORDER BY 1")
        .fetch_all(&h.db.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_cancel_racing_20_workers_cancels_or_leaves_each_job_never_both() {
    let h = Harness::start().await;
    for i in 0..300 {
        h.enqueue(Q, &format!("refund-{i}"), "{}").await;
    }
    let mut workers = Vec::new();
    for w in 0..20 {
        let mut c = h.another_client().await;
        workers.push(tokio::spawn(async move {
            loop {
                let claimed = c
                    .claim(jobfence_api::v1::ClaimRequest {
                        queue: Q.into(),
                        worker_id: format!("worker-{w}"),
                        max_jobs: 1,
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let Some(job) = claimed.jobs.into_iter().next().and_then(|j| j.job) else {
                    return;
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
            }
        }));
    }
    let (conn, args) = parse(
        &h,
        &[
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
    let mut bulk = Bulk::connect(&conn, args).await.unwrap();
    let selected = bulk.select().await.unwrap();
    let tally = bulk.apply(&selected).await;
    for w in workers {
        w.await.unwrap();
    }
    let skipped: u64 = tally.skipped.values().sum();
    assert_eq!(tally.applied + skipped, tally.selected, "{tally:?}");
    assert!(tally.errors.is_empty(), "{tally:?}");
    let by_state = states(&h).await;
    let count = |s: &str| by_state.iter().find(|r| r.0 == s).map_or(0, |r| r.1);
    assert_eq!(count("cancelled") as u64, tally.applied, "{by_state:?}");
    assert_eq!(count("cancelled") + count("succeeded"), 300, "{by_state:?}");
    let both: (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM jobs j WHERE EXISTS (SELECT 1 FROM job_events e \
         WHERE e.job_id = j.id AND e.kind = 'cancelled') AND EXISTS (SELECT 1 FROM job_events e \
         WHERE e.job_id = j.id AND e.kind = 'completed')",
    )
    .fetch_one(&h.db.pool())
    .await
    .unwrap();
    assert_eq!(both.0, 0, "no job both cancelled and completed");
    h.finish().await;
}

#[tokio::test]
async fn a_bulk_resolve_skips_the_job_another_operator_resolved_after_the_listing() {
    let h = Harness::start().await;
    let mut parked_jobs = Vec::new();
    for i in 0..4 {
        let job = h.parked(Q, &format!("refund-{i}")).await;
        parked_jobs.push((job.job_id, job.attempt));
    }
    let (conn, args) = parse(
        &h,
        &[
            "requeue",
            "--queue",
            Q,
            "--reason-code",
            "REQUESTED",
            "--operator",
            "alice",
            "--reason",
            "provider back",
        ],
    );
    let mut bulk = Bulk::connect(&conn, args).await.unwrap();
    let selected = bulk.select().await.unwrap();
    assert_eq!(selected.len(), 4);
    // Bob resolves one between the listing and the action.
    let (bobs, attempt) = parked_jobs[1];
    jobfence_api::v1::job_admin_client::JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
        .resolve_manual_review(ResolveManualReviewRequest {
            job_id: bobs,
            attempt,
            resolution: Resolution::Failed as i32,
            operator: "bob".into(),
            reason: "checked the dashboard".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let tally = bulk.apply(&selected).await;
    assert_eq!(tally.applied, 3, "{tally:?}");
    assert_eq!(
        tally.skipped.get("JOB_NOT_IN_MANUAL_REVIEW"),
        Some(&1),
        "{tally:?}"
    );
    assert_eq!(
        h.row(bobs).await.state,
        JobState::Failed,
        "bob's resolution stands"
    );
    for &(id, _) in parked_jobs.iter().filter(|j| j.0 != bobs) {
        assert_eq!(h.row(id).await.state, JobState::Ready, "requeued");
        assert_eq!(h.count_events(id, "manual_review_resolved").await, 1);
    }
    h.finish().await;
}

#[tokio::test]
async fn bad_input_and_dry_runs_change_nothing() {
    let h = Harness::start().await;
    for i in 0..3 {
        h.enqueue(Q, &format!("refund-{i}"), "{}").await;
    }
    let before = states(&h).await;
    let no_filter = run(&h, &["cancel", "--reason", "x"]).await.unwrap_err();
    assert!(no_filter.contains("explicit --all"), "{no_filter}");
    let unknown = run(&h, &["cancel", "--queue", "refundz", "--reason", "x"])
        .await
        .unwrap_err();
    assert!(unknown.contains("no job is in this queue"), "{unknown}");
    assert!(
        unknown.contains("`jobfence stats` lists the queues"),
        "{unknown}"
    );
    let code = run(
        &h,
        &[
            "fail",
            "--queue",
            Q,
            "--reason-code",
            "LATE",
            "--reason",
            "x",
        ],
    )
    .await
    .unwrap_err();
    assert!(code.contains("not a reason of manual review"), "{code}");
    let over = run(&h, &["cancel", "--queue", Q, "--max", "2", "--reason", "x"])
        .await
        .unwrap_err();
    assert!(
        over.contains("3 jobs selected, more than --max 2: add --yes"),
        "{over}"
    );
    let dry = run(
        &h,
        &[
            "cancel",
            "--all",
            "--key-prefix",
            "refund-",
            "--dry-run",
            "--reason",
            "x",
        ],
    )
    .await
    .unwrap();
    assert!(
        dry.starts_with("3 jobs selected (dry run: nothing changed)"),
        "{dry}"
    );
    assert_eq!(states(&h).await, before, "nothing changed");
    let done = run(
        &h,
        &[
            "cancel",
            "--queue",
            Q,
            "--key-prefix",
            "refund-1",
            "--operator",
            "alice",
            "--reason",
            "dup",
        ],
    )
    .await
    .unwrap();
    assert!(
        done.starts_with("1 selected: 1 applied, 0 skipped"),
        "{done}"
    );
    // Without an operator's name (no credential says it), the first job's
    // refusal stops the action and is printed; nothing is written.
    let nameless = run(&h, &["cancel", "--queue", Q, "--reason", "x"])
        .await
        .unwrap_err();
    assert!(
        nameless.contains("operator: must not be empty"),
        "{nameless}"
    );
    let refused: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM job_events WHERE kind = 'cancel_rejected'")
            .fetch_one(&h.db.pool())
            .await
            .unwrap();
    assert_eq!(refused, 0);
    h.finish().await;
}

/// A bulk the coordinator refuses as a request (here another operator's
/// name than the credential's, OPERATOR_MISMATCH) stops after its first
/// batch: the rest is not sent, the summary says so, and the error says
/// to fix the cause rather than run it again as it is.
#[tokio::test]
async fn a_bulk_refused_as_a_request_stops_after_its_first_batch() {
    let s = kit::secure::Secure::start(false).await;
    let items: Vec<jobfence_domain::Enqueue> = (0..3)
        .map(|k| jobfence_domain::Enqueue {
            queue: Q.into(),
            operation_key: format!("refund-{k}"),
            payload: "{}".into(),
            delay: std::time::Duration::ZERO,
            fairness_key: None,
            priority: Default::default(),
        })
        .collect();
    s.coordinator.store().enqueue_batch(&items).await.unwrap();
    let args = [
        "jobs",
        "bulk",
        "cancel",
        "--queue",
        Q,
        "--operator",
        "mallory",
        "--reason",
        "INC-7",
        "--batch-size",
        "1",
        "--max-rate",
        "0",
    ];
    let (printed, done) = crate::operator_cli::run_as(&s, "alice", &args).await;
    assert!(printed.contains("OPERATOR_MISMATCH: 1"), "{printed}");
    assert!(
        printed.contains("not sent (the request itself was refused): 2"),
        "{printed}"
    );
    let err = done.unwrap_err();
    assert!(err.contains("refused the request itself"), "{err}");
    assert!(!err.contains("run it again for them"), "{err}");
    let ready: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'ready'")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(ready, 3, "nothing cancelled");
    s.stop().await;
}
