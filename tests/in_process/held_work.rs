//! Held work says why, where the work is: `jobfence stats` (and the
//! QueueStats it reads) names what holds a queue's ready jobs when its
//! provider does: an operator's pause with who and since when, and a spent
//! budget; a queue nothing holds says nothing.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_api::v1::{
    EnqueueRequest, PauseProviderRequest, ProviderBudget, ProviderPause, PutProviderRequest,
    QueueStatsRequest,
};
use jobfence_operator::{Cli, Operation};
use kit::secure::Secure;

/// `jobfence stats ARGS…` as `who`; what it printed.
async fn stats(s: &Secure, who: &str, args: &[&str]) -> String {
    let endpoint = format!("https://{}", s.addr);
    let ca = s.files.ca.display().to_string();
    let token = s.files.token(who).display().to_string();
    let mut argv = vec![
        "jobfence",
        "stats",
        "--endpoint",
        &endpoint,
        "--tls-ca",
        &ca,
    ];
    argv.extend_from_slice(&["--token-file", &token]);
    argv.extend_from_slice(args);
    let op = Cli::try_parse_from(argv).unwrap().command;
    assert!(matches!(op, Operation::Stats(_)));
    let mut out = Vec::new();
    jobfence_operator::run(op, &mut out).await.unwrap();
    String::from_utf8(out).unwrap()
}

async fn enqueue(s: &Secure, who: &str, queue: &str, key: &str) {
    s.worker(Some(who))
        .await
        .enqueue(EnqueueRequest {
            queue: queue.into(),
            operation_key: key.into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn stats_say_which_provider_holds_a_queues_ready_jobs_and_why() {
    let s = Secure::start(false).await;
    let mut admin = s.admin(Some("alice")).await;
    admin
        .put_provider(PutProviderRequest {
            name: "psp".into(),
            // One unit a day: spent by the first claim, and then spent.
            budget: Some(ProviderBudget {
                rate_per_second: 1.0 / 86_400.0,
                burst: 1,
                ..Default::default()
            }),
            queues: vec!["refunds".into()],
            operator: String::new(),
            reason: "a tiny budget".into(),
        })
        .await
        .unwrap();
    enqueue(&s, "shop", "refunds", "refund-1").await;
    enqueue(&s, "shop", "refunds", "refund-2").await;
    let quiet = stats(&s, "alice", &[]).await;
    assert!(!quiet.contains("held"), "nothing holds it yet: {quiet}");

    // The budget's one unit goes to a claim: the other job waits for it.
    let mut w = s.worker(Some("refunds-worker")).await;
    let claimed = w
        .claim(jobfence_api::v1::ClaimRequest {
            queue: "refunds".into(),
            worker_id: "w-1".into(),
            max_jobs: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(claimed.jobs.len(), 1);
    let spent = stats(&s, "alice", &[]).await;
    assert!(
        spent.contains("refunds: 1 ready held: provider psp's budget is spent: the next unit in"),
        "{spent}"
    );

    // An operator's pause wins, with who and since when.
    admin
        .pause_provider(PauseProviderRequest {
            name: "psp".into(),
            pause: ProviderPause::All as i32,
            operator: String::new(),
            reason: "INC-9: provider 5xx".into(),
        })
        .await
        .unwrap();
    let paused = stats(&s, "alice", &[]).await;
    assert!(
        paused.contains(
            "refunds: 1 ready held: provider psp paused: INC-9: provider 5xx (by alice since "
        ),
        "{paused}"
    );
    let answer = admin
        .queue_stats(QueueStatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let held = answer.queues[0].held.clone().expect("held");
    assert_eq!(
        (held.provider.as_str(), held.kind.as_str(), held.by.as_str()),
        ("psp", "PAUSED", "alice")
    );
    assert!(held.since.is_some());
    let json = stats(&s, "alice", &["--json"]).await;
    assert!(json.contains(r#""kind": "PAUSED""#), "{json}");

    // A queue no provider governs says nothing.
    enqueue(&s, "payouts-worker", "payouts", "payout-1").await;
    let answer = admin
        .queue_stats(QueueStatsRequest {
            queue: "payouts".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.queues[0].held, None);
    s.stop().await;
}
