//! The operator service: manual-review resolution fenced like every other
//! write (two operators, one winner, both in the events), cancellation of
//! never-dispatched jobs only, listing, stats, and the operator CLI.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{
    self as proto, CancelJobRequest, FailDisposition, FailRequest, GetJobDetailRequest,
    ListJobsRequest, NextAction, QueueStatsRequest, Resolution, ResolveManualReviewRequest,
};
use jobfence_domain::JobState;
use jobfence_operator::{Cli, Operation};
use kit::{meta, reason, secs, Harness};
use serde_json::Value;
use tonic::transport::Channel;
use tonic::Code;

const Q: &str = "refunds";

async fn admin(h: &Harness) -> JobAdminClient<Channel> {
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
}

fn resolve(job_id: u64, attempt: u64, operator: &str, r: Resolution) -> ResolveManualReviewRequest {
    ResolveManualReviewRequest {
        job_id,
        attempt,
        resolution: r as i32,
        operator: operator.into(),
        reason: format!("{operator} checked the provider dashboard"),
        provider_reference: if r == Resolution::Succeeded {
            "re_dashboard".into()
        } else {
            String::new()
        },
        result: String::new(),
        delay: None,
        authorize_resend: false,
    }
}

#[tokio::test]
async fn two_operators_resolve_the_same_job_and_exactly_one_wins() {
    let h = Harness::start().await;
    let job = h.parked(Q, "refund-contested").await;
    assert_eq!(job.attempt, 1);

    // Alice's resolution holds the row lock and stops there.
    let mut alice_at_lock = h.pauses.arm(jobfence_store::PausePoint::ResolveAfterLock);
    let mut a = admin(&h).await;
    let alice = tokio::spawn(async move {
        a.resolve_manual_review(resolve(job.job_id, 1, "alice", Resolution::Succeeded))
            .await
    });
    alice_at_lock.reached().await;
    // Bob resolves the same job, same attempt: he waits on the row lock.
    let mut b = admin(&h).await;
    let bob = tokio::spawn(async move {
        b.resolve_manual_review(resolve(job.job_id, 1, "bob", Resolution::RetryReconcile))
            .await
    });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    alice_at_lock.release();

    let won = alice.await.unwrap().expect("alice wins").into_inner();
    let won_job = won.job.unwrap();
    assert_eq!(won_job.state, proto::JobState::Succeeded as i32);
    assert_eq!(won_job.provider_reference, "re_dashboard");
    assert!(!won.replayed);
    let lost = bob.await.unwrap().expect_err("bob loses");
    assert_eq!(lost.code(), Code::FailedPrecondition);
    assert_eq!(reason(&lost), "JOB_NOT_IN_MANUAL_REVIEW");
    assert_eq!(meta(&lost, "current_state"), "succeeded");
    assert_eq!(meta(&lost, "presented_attempt"), "1");
    assert_eq!(meta(&lost, "current_attempt"), "1");

    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(
        row.attempt, 1,
        "an operator resolution hands out no attempt"
    );
    assert!(row.state_reason.unwrap().starts_with("resolved by alice: "));
    assert!(row.finished_at.is_some());

    // Both attempts are in the events, with the attempt each presented.
    let events = admin(&h)
        .await
        .get_job(GetJobDetailRequest { job_id: job.job_id })
        .await
        .unwrap()
        .into_inner()
        .events;
    let operator_events: Vec<(String, u64, Value)> = events
        .iter()
        .filter(|e| e.kind == "manual_review_resolved" || e.kind == "resolve_rejected")
        .map(|e| {
            (
                e.kind.clone(),
                e.attempt,
                serde_json::from_str(&e.detail).unwrap(),
            )
        })
        .collect();
    assert_eq!(operator_events.len(), 2);
    let (kind, attempt, detail) = &operator_events[0];
    assert_eq!((kind.as_str(), *attempt), ("manual_review_resolved", 1));
    assert_eq!(detail["operator"], "alice");
    assert_eq!(detail["action"], "succeeded");
    assert_eq!(detail["provider_reference"], "re_dashboard");
    let (kind, attempt, detail) = &operator_events[1];
    assert_eq!((kind.as_str(), *attempt), ("resolve_rejected", 1));
    assert_eq!(detail["operator"], "bob");
    assert_eq!(detail["action"], "retry_reconcile");
    assert!(detail["refused"].as_str().unwrap().contains("succeeded"));
    assert_eq!(
        events.last().unwrap().to_state,
        proto::JobState::Unspecified as i32,
        "a refusal changes nothing"
    );
    h.finish().await;
}

#[tokio::test]
async fn resolutions_are_validated_replayed_and_fenced_on_the_attempt() {
    let h = Harness::start().await;
    let mut a = admin(&h).await;
    let job = h.parked(Q, "refund-retry").await;

    // A resend needs explicit authorization; success needs a reference.
    let mut req = resolve(job.job_id, 1, "carol", Resolution::RetryExecute);
    let status = a.resolve_manual_review(req.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(reason(&status), "INVALID_REQUEST");
    let mut no_ref = resolve(job.job_id, 1, "carol", Resolution::Succeeded);
    no_ref.provider_reference.clear();
    no_ref.operator.clear();
    let status = a.resolve_manual_review(no_ref).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(h.row(job.job_id).await.state, JobState::ManualReview);

    // The provider's idempotency window closed while the job was parked;
    // the operator authorizes the resend anyway, so it restarts.
    sqlx::query("UPDATE jobs SET first_dispatched_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 25 HOUR) WHERE id = ?")
        .bind(job.job_id)
        .execute(&h.pool)
        .await
        .unwrap();
    req.authorize_resend = true;
    req.delay = secs(0);
    let done = a
        .resolve_manual_review(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(!done.replayed);
    let ready = done.job.unwrap();
    assert_eq!(ready.state, proto::JobState::Ready as i32);
    assert_eq!(ready.next_action, NextAction::Execute as i32);
    assert!(ready.first_dispatched_at.is_none());
    // The same call again (its response was lost): a replay, nothing written.
    let again = a
        .resolve_manual_review(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(
        h.count_events(job.job_id, "manual_review_resolved").await,
        1
    );
    assert_eq!(h.count_events(job.job_id, "resolve_rejected").await, 0);

    // The next claim sends again (not a reconcile), as attempt 2.
    let resent = h.claim_one(Q, "worker-b").await;
    assert_eq!(resent.attempt, 2);
    assert_eq!(resent.next_action, NextAction::Execute as i32);
    assert_eq!(resent.dispatch_count, 2);
    // Parked again under attempt 2: an operator still holding attempt 1 is
    // told it is superseded.
    h.client
        .clone()
        .fail(FailRequest {
            job_id: job.job_id,
            attempt: 2,
            disposition: FailDisposition::ManualReview as i32,
            error: "still unknown".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
    let status = a
        .resolve_manual_review(resolve(job.job_id, 1, "dave", Resolution::Failed))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(reason(&status), "ATTEMPT_SUPERSEDED");
    assert_eq!(meta(&status, "current_attempt"), "2");
    let done = a
        .resolve_manual_review(resolve(job.job_id, 2, "dave", Resolution::Failed))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.job.unwrap().state, proto::JobState::Failed as i32);
    assert_eq!(h.count_events(job.job_id, "resolve_rejected").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn only_a_job_never_dispatched_can_be_cancelled() {
    let h = Harness::start().await;
    let mut a = admin(&h).await;
    let fresh = h.enqueue(Q, "refund-fresh", "{}").await;
    let cancel = |job_id, attempt| CancelJobRequest {
        job_id,
        attempt,
        operator: "erin".into(),
        reason: "duplicate request from support".into(),
    };
    let done = a
        .cancel_job(cancel(fresh.job_id, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.job.unwrap().state, proto::JobState::Cancelled as i32);
    assert!(
        h.claim(Q, "worker-a", 5).await.is_empty(),
        "cancelled jobs are never claimed"
    );

    // Dispatched, then back to ready by a retry: not cancellable.
    let sent = h.enqueue(Q, "refund-sent", "{}").await;
    let claimed = h.claim_one(Q, "worker-a").await;
    let status = a.cancel_job(cancel(sent.job_id, 1)).await.unwrap_err();
    assert_eq!(reason(&status), "JOB_NOT_CANCELLABLE");
    assert_eq!(meta(&status, "current_state"), "running");
    h.client
        .clone()
        .fail(FailRequest {
            job_id: sent.job_id,
            attempt: claimed.attempt,
            disposition: FailDisposition::RetryReconcile as i32,
            error: "timeout".into(),
            retry_delay: secs(600),
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
    let status = a.cancel_job(cancel(sent.job_id, 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(reason(&status), "JOB_NOT_CANCELLABLE");
    assert_eq!(meta(&status, "current_state"), "ready");
    assert_eq!(meta(&status, "dispatch_count"), "1");
    assert_eq!(h.row(sent.job_id).await.state, JobState::Ready);
    assert_eq!(h.count_events(sent.job_id, "cancel_rejected").await, 2);
    let missing = a.cancel_job(cancel(999_999, 0)).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    h.finish().await;
}

#[tokio::test]
async fn list_jobs_pages_and_queue_stats_count() {
    let h = Harness::start().await;
    let mut a = admin(&h).await;
    for i in 0..5 {
        h.enqueue(Q, &format!("refund-{i}"), "{}").await;
    }
    h.enqueue("payouts", "payout-1", "{}").await;
    let taken = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(taken.job_id).await;
    let over = h.claim(Q, "worker-b", 1).await;
    assert!(over[0].takeover);

    // Ready jobs of refunds, two per page, oldest first.
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let page = a
            .list_jobs(ListJobsRequest {
                queue: Q.into(),
                states: vec![proto::JobState::Ready as i32],
                min_age: None,
                page_size: 2,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        ids.extend(page.jobs.iter().map(|j| j.job_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(ids.len(), 4);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert!(!ids.contains(&taken.job_id));
    // Nothing was created an hour ago.
    let old = a
        .list_jobs(ListJobsRequest {
            min_age: secs(3600),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(old.jobs.is_empty());

    let stats = a
        .queue_stats(QueueStatsRequest {
            queue: String::new(),
            window: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.window.unwrap().seconds, 3600);
    let refunds = stats.queues.iter().find(|q| q.queue == Q).unwrap();
    let count = |s: proto::JobState| {
        refunds
            .counts
            .iter()
            .find(|c| c.state == s as i32)
            .map_or(0, |c| c.jobs)
    };
    assert_eq!(
        (
            count(proto::JobState::Ready),
            count(proto::JobState::Running)
        ),
        (4, 1)
    );
    assert_eq!(refunds.takeovers, 1);
    assert_eq!(refunds.stale_write_rejections, 0);
    assert!(refunds.oldest_unfinished_age.is_some());
    let states: Vec<i32> = refunds.oldest.iter().map(|o| o.state).collect();
    assert_eq!(
        states,
        [
            proto::JobState::Ready as i32,
            proto::JobState::Running as i32
        ]
    );
    assert_eq!(refunds.oldest[1].job_id, taken.job_id);
    assert_eq!(stats.queues.len(), 2);
    h.finish().await;
}

/// Runs one `jobfence …` operator command against the harness; returns
/// what it printed, or its error text.
async fn cli(h: &Harness, args: &[&str]) -> Result<String, String> {
    let endpoint = format!("http://{}", h.addr);
    let mut argv = vec!["jobfence"];
    argv.extend_from_slice(&args[..1]);
    argv.extend_from_slice(&["--endpoint", endpoint.as_str()]);
    argv.extend_from_slice(&args[1..]);
    let parsed = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let op = match parsed.command {
        op @ (Operation::Jobs(_) | Operation::Stats(_) | Operation::Events(_)) => op,
        other => panic!("not an operator command: {other:?}"),
    };
    let mut out = Vec::new();
    jobfence_operator::run(op, &mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8(out).unwrap())
}

#[tokio::test]
async fn operator_cli_prints_tables_json_and_precise_refusals() {
    let h = Harness::start().await;
    let job = h.parked(Q, "refund-cli").await;
    let id = job.job_id.to_string();

    let table = cli(&h, &["jobs", "list", "--state", "manual-review"])
        .await
        .unwrap();
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("ID  QUEUE"));
    let row = lines.next().unwrap();
    assert!(row.contains("manual_review"), "{row}");
    // The worker's own explanation, not the bare reason code.
    assert!(
        row.ends_with("the worker asked for an operator: provider says unknown"),
        "{row}"
    );
    // The state as the table prints it is taken too.
    let same = cli(&h, &["jobs", "list", "--state", "manual_review"])
        .await
        .unwrap();
    assert_eq!(same, table);

    let json: Value =
        serde_json::from_str(&cli(&h, &["jobs", "--json", "show", &id]).await.unwrap()).unwrap();
    assert_eq!(json["job"]["state"], "manual_review");
    assert_eq!(json["job"]["attempt"], 1);
    assert_eq!(json["events"].as_array().unwrap().len(), 3);

    let done = cli(
        &h,
        &[
            "jobs",
            "resolve",
            &id,
            "--attempt",
            "1",
            "--to",
            "succeeded",
            "--operator",
            "frank",
            "--reason",
            "seen in dashboard",
            "--provider-reference",
            "re_cli",
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        done,
        format!("job {id} resolved: now succeeded (attempt 1)\n")
    );
    let refused = cli(
        &h,
        &[
            "jobs",
            "resolve",
            &id,
            "--attempt",
            "1",
            "--to",
            "failed",
            "--operator",
            "grace",
            "--reason",
            "late",
        ],
    )
    .await
    .unwrap_err();
    assert!(
        refused.starts_with("FailedPrecondition JOB_NOT_IN_MANUAL_REVIEW"),
        "{refused}"
    );
    assert!(refused.contains("current_state=succeeded"), "{refused}");

    let stats: Value = serde_json::from_str(&cli(&h, &["stats", "--json"]).await.unwrap()).unwrap();
    assert_eq!(stats["queues"][0]["counts"]["succeeded"], 1);
    let events = cli(&h, &["events", "list", "--after", "0"]).await.unwrap();
    assert!(events.contains("manual_review_resolved"));
    assert!(events.contains("resolve_rejected"));
    h.finish().await;
}

/// The connection of an operator command, parsed from `argv`.
fn parsed_connection(argv: &[&str]) -> Result<(String, bool), String> {
    let parsed = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let conn = match parsed.command {
        Operation::Jobs(a) => a.conn,
        Operation::Stats(a) => a.conn,
        Operation::Events(a) => a.conn,
        other => panic!("not an operator command: {other:?}"),
    };
    Ok((conn.endpoint, conn.json))
}

#[test]
fn endpoint_and_json_are_accepted_after_every_operator_subcommand() {
    let commands: [&[&str]; 7] = [
        &["jobs", "list", "--state", "manual-review"],
        &["jobs", "show", "7"],
        &[
            "jobs",
            "resolve",
            "7",
            "--attempt",
            "1",
            "--to",
            "failed",
            "--operator",
            "o",
            "--reason",
            "r",
        ],
        &["jobs", "cancel", "7", "--operator", "o", "--reason", "r"],
        &["stats", "--queue", "refunds"],
        &["events", "list", "--after", "3"],
        &["events", "watch"],
    ];
    for command in commands {
        // At the end of the command, where users type it...
        let mut argv = vec!["jobfence"];
        argv.extend_from_slice(command);
        argv.extend_from_slice(&["--endpoint", "http://10.0.0.9:1", "--json"]);
        assert_eq!(
            parsed_connection(&argv),
            Ok(("http://10.0.0.9:1".to_owned(), true)),
            "{argv:?}"
        );
        // ...and right after the command group, as before.
        let mut argv = vec!["jobfence", command[0], "--endpoint", "http://10.0.0.9:2"];
        argv.extend_from_slice(&command[1..]);
        assert_eq!(
            parsed_connection(&argv),
            Ok(("http://10.0.0.9:2".to_owned(), false)),
            "{argv:?}"
        );
    }
}
