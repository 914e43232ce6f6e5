//! A queue paused without a provider (`jobfence queue-policies pause`),
//! stored: one coordinator pauses, another's claims hand out nothing (a
//! long poll waits its whole wait instead of spinning), stats say who
//! paused it and why, the pause and resume are in the changes, and after a
//! resume on the first coordinator the second hands the job out. Bad
//! input is refused with field violations.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{
    ClaimRequest, ListPolicyChangesRequest, PauseQueueRequest, QueueStatsRequest,
    ResumeQueueRequest,
};
use jobfence_operator::{Cli, Operation};
use kit::{reason, Harness};
use std::time::{Duration, Instant};
use tonic::Code;

const Q: &str = "refunds";

/// `jobfence queue-policies ARGS…` against `h`; what it printed.
async fn queue_policies(h: &Harness, args: &[&str]) -> String {
    let endpoint = format!("http://{}", h.addr);
    let mut argv = vec!["jobfence", "queue-policies", "--endpoint", &endpoint];
    argv.extend_from_slice(args);
    let op = Cli::try_parse_from(argv).unwrap().command;
    assert!(matches!(op, Operation::QueuePolicies(_)));
    let mut out = Vec::new();
    jobfence_operator::run(op, &mut out).await.unwrap();
    String::from_utf8(out).unwrap()
}

fn claim(wait: i64) -> ClaimRequest {
    ClaimRequest {
        queue: Q.into(),
        worker_id: "w-b".into(),
        max_jobs: 1,
        wait: kit::secs(wait),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_queue_paused_on_one_coordinator_hands_out_nothing_on_another_until_resumed() {
    let h = Harness::start().await;
    let other = h.replica(Default::default()).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let paused = queue_policies(
        &h,
        &[
            "pause",
            Q,
            "--operator",
            "alice",
            "--reason",
            "INC-3: bad payloads",
        ],
    )
    .await;
    assert_eq!(
        paused,
        format!("queue {Q} paused: its claims hand out nothing until it is resumed\n")
    );

    // The other coordinator's claim, long-polling 1 s, gets nothing and
    // waits its wait (no busy loop on a job it may not hand out).
    let mut b = other.client.clone();
    let started = Instant::now();
    let got = b.claim(claim(1)).await.unwrap().into_inner();
    assert!(got.jobs.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(h.row(job.job_id).await.attempt, 0, "never handed out");

    // Where the work waits, it says why.
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let stats = admin
        .queue_stats(QueueStatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let held = stats.queues[0].held.clone().expect("held");
    assert_eq!(
        (held.kind.as_str(), held.by.as_str(), held.why.as_str()),
        (
            "QUEUE_PAUSED",
            "alice",
            "queue refunds paused: INC-3: bad payloads"
        )
    );

    // Resumed on the first: the second hands the job out.
    let resumed = queue_policies(
        &h,
        &["resume", Q, "--operator", "alice", "--reason", "fixed"],
    )
    .await;
    assert_eq!(resumed, format!("queue {Q} resumed\n"));
    let got = b.claim(claim(0)).await.unwrap().into_inner();
    assert_eq!(got.jobs.len(), 1);
    let again = queue_policies(&h, &["resume", Q, "--operator", "alice", "--reason", "x"]).await;
    assert_eq!(
        again,
        format!("queue {Q} was not paused: nothing changed\n")
    );

    // Both changes are recorded, and the row of a queue with nothing else
    // stored is gone again.
    let changes = admin
        .list_policy_changes(ListPolicyChangesRequest {
            subject: format!("queue:{Q}"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let actions: Vec<&str> = changes.changes.iter().map(|c| c.action.as_str()).collect();
    assert_eq!(actions, ["resume_queue", "pause_queue"]);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM queue_policies")
        .fetch_one(&h.db.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0);
    h.finish().await;
}

#[tokio::test]
async fn bad_input_to_a_queue_pause_is_refused_with_field_violations() {
    let h = Harness::start().await;
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    for (queue, operator, why) in [
        ("bad queue!", "alice", "x"),
        (Q, "", "x"),
        (Q, "alice", " "),
    ] {
        let refused = admin
            .pause_queue(PauseQueueRequest {
                queue: queue.into(),
                operator: operator.into(),
                reason: why.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(reason(&refused), "INVALID_REQUEST");
    }
    let refused = admin
        .resume_queue(ResumeQueueRequest {
            queue: String::new(),
            operator: "alice".into(),
            reason: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM queue_policies")
        .fetch_one(&h.db.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing written");
    h.finish().await;
}

/// A resume waiting on the queue's row lock (held here by another
/// transaction on the default MariaDB, lock waits of 1 s) times out, is
/// run again and counted, and applies once the row is free: a conflict,
/// never an outage.
#[tokio::test]
async fn a_resume_behind_a_row_lock_is_run_again_counted_and_applied() {
    let h = Harness::start_with_lock_wait(1).await;
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let by = |reason: &str| (String::from("alice"), reason.to_owned());
    let (operator, reason) = by("INC-4");
    admin
        .pause_queue(PauseQueueRequest {
            queue: Q.into(),
            operator,
            reason,
        })
        .await
        .unwrap();
    let mut holder = h.db.pool().begin().await.unwrap();
    sqlx::query("SELECT queue FROM queue_policies WHERE queue = ? FOR UPDATE")
        .bind(Q)
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let store = h.coordinator.store().clone();
    let before = store.conflicts();
    let resumed = tokio::spawn(async move {
        let (operator, reason) = by("fixed");
        admin
            .resume_queue(ResumeQueueRequest {
                queue: Q.into(),
                operator,
                reason,
            })
            .await
    });
    kit::until("the resume's lock wait timed out and was run again", || {
        store.conflicts().0 > before.0
    })
    .await;
    holder.rollback().await.unwrap();
    let done = resumed.await.unwrap().expect("applied after its conflict");
    assert!(done.into_inner().resumed);
    let (retried, reported) = store.conflicts();
    assert!(retried > before.0, "retried {retried}");
    assert_eq!(reported, before.1, "no conflict reached the caller");
    let paused: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM queue_policies WHERE paused_at IS NOT NULL")
            .fetch_one(&h.db.pool())
            .await
            .unwrap();
    assert_eq!(paused, 0);
    h.finish().await;
}

/// A resume never waits for the queue rows a claim of another queue
/// holds. A claim of a provider's queue holds the provider's queue rows
/// until its COMMIT (paused here just before it); the clean-up of emptied
/// queue rows that a resume runs reads only the resumed queue's row. (It
/// read the whole table, and a DELETE waits for every locked row it reads:
/// a resume of one of the provider's own queues, holding that row, closed
/// a cycle with the claim; with forty more queue rows and the table's
/// statistics computed the server did read it whole.) With lock waits of
/// 1 s, a resume that waited would fail.
#[tokio::test]
async fn a_resume_never_waits_for_the_queue_rows_a_claim_holds() {
    let h = Harness::start_with_lock_wait(1).await;
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
        .put_provider(jobfence_api::v1::PutProviderRequest {
            name: "stripe".into(),
            budget: Some(jobfence_api::v1::ProviderBudget {
                rate_per_second: 1000.0,
                burst: 100,
                ..Default::default()
            }),
            queues: vec!["a".into(), "b".into()],
            operator: "alice".into(),
            reason: "the provider's limit".into(),
        })
        .await
        .unwrap();
    h.enqueue("a", "refund-a", "{}").await;
    let pause = ["pause", Q, "--operator", "alice", "--reason", "INC-4"];
    queue_policies(&h, &pause).await;
    // Forty more queues with a stored policy and no provider, and the
    // table's statistics computed: a DELETE restricted by no key then reads
    // the whole table (the rows the claim will hold included) rather than
    // the range of queues with no provider, which is most of it.
    let rows: Vec<String> = (0..40)
        .map(|i| format!("('policy-{i}', 600000000, 3, UTC_TIMESTAMP(6), 'alice')"))
        .collect();
    let insert = format!(
        "INSERT INTO queue_policies (queue, resend_window_us, max_dispatches, updated_at, \
         updated_by) VALUES {}",
        rows.join(", ")
    );
    for sql in [insert.as_str(), "ANALYZE TABLE queue_policies"] {
        sqlx::query(sql).fetch_all(&h.db.pool()).await.unwrap();
    }
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::ClaimBeforeCommit);
    let mut client = h.client.clone();
    let held = tokio::spawn(async move {
        let req = ClaimRequest {
            queue: "a".into(),
            ..claim(0)
        };
        client.claim(req).await
    });
    gate.reached().await;
    let resumed = queue_policies(&h, &["resume", Q, "--operator", "alice", "--reason", "ok"]).await;
    assert_eq!(resumed, format!("queue {Q} resumed\n"));
    gate.release();
    let got = held.await.unwrap().unwrap().into_inner();
    assert_eq!(got.jobs.len(), 1);
    h.finish().await;
}
