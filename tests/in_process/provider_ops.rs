//! Providers as operators use them, against a coordinator served with TLS
//! and the callers file (so the name recorded is the credential's):
//!
//! - the CLI round trip: `jobfence providers set|list|pause --sends-only|
//!   resume|history|delete` and `jobfence queue-policies set|list|history|
//!   delete`, with the pause and the throttle seen by real claims;
//! - bad input: every bad field printed with the flag that sets it, and
//!   nothing written;
//! - the console's Providers page: what it shows, its pause / resume /
//!   budget forms (CSRF-checked, recorded as the console's operator), and a
//!   refused form that writes nothing.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_api::v1::{ClaimRequest, EnqueueRequest, FailDisposition, FailRequest};
use jobfence_operator::{Cli, Operation};
use kit::secure::Secure;
use serde_json::Value;

/// Runs `jobfence GROUP [ARGS…]` as the operator `alice` (her token, the
/// coordinator's CA); returns what it printed, or its error text.
async fn cli(s: &Secure, args: &[&str]) -> Result<String, String> {
    cli_as(s, "alice", args).await
}

/// [`cli`] with the token of `caller`.
async fn cli_as(s: &Secure, caller: &str, args: &[&str]) -> Result<String, String> {
    let endpoint = format!("https://{}", s.addr);
    let ca = s.files.ca.display().to_string();
    let token = s.files.token(caller).display().to_string();
    let mut argv = vec!["jobfence", args[0]];
    argv.extend_from_slice(&[
        "--endpoint",
        &endpoint,
        "--tls-ca",
        &ca,
        "--token-file",
        &token,
    ]);
    argv.extend_from_slice(&args[1..]);
    let parsed = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let op = match parsed.command {
        op @ (Operation::Providers(_) | Operation::QueuePolicies(_)) => op,
        other => panic!("not a provider command: {other:?}"),
    };
    let mut out = Vec::new();
    jobfence_operator::run(op, &mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8(out).unwrap())
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// The non-empty cells of a table line printed by the CLI (columns are
/// at least two spaces apart; a cell holds single spaces at most).
fn cells(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// The cells of the row starting with `first` in a table printed by the CLI.
fn row<'a>(table: &'a str, first: &str) -> Vec<&'a str> {
    let line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first} in:\n{table}"));
    cells(line)
}

fn claim(queue: &str) -> ClaimRequest {
    ClaimRequest {
        queue: queue.into(),
        worker_id: "refunds-1".into(),
        max_jobs: 5,
        lease: None,
        wait: None,
    }
}

#[tokio::test]
async fn operators_set_pause_resume_and_delete_a_provider_with_the_cli() {
    let s = Secure::start(false).await;
    let mut w = s.worker(Some("refunds-worker")).await;
    let listed = cli(&s, &["providers", "list"]).await.unwrap();
    assert!(listed.starts_with("no providers"), "{listed}");

    let set = cli(
        &s,
        &[
            "providers",
            "set",
            "psp",
            "--rate",
            "80",
            "--burst",
            "100",
            "--max-in-flight",
            "50",
            "--reconcile-cost",
            "2",
            "--queue",
            "refunds",
            "--queue",
            "payouts",
            "--reason",
            "live 100 req/s, 80 % for jobfence",
        ],
    )
    .await
    .unwrap();
    assert!(
        set.starts_with("provider psp created: 80/s, burst 100, for queues payouts, refunds\n"),
        "{set}"
    );

    // One job running, one waiting: the list shows the budget and what
    // is in flight now.
    for key in ["refund-1", "refund-2"] {
        w.enqueue(EnqueueRequest {
            queue: "refunds".into(),
            operation_key: key.into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap();
    }
    let first = w
        .claim(ClaimRequest {
            max_jobs: 1,
            ..claim("refunds")
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(first.len(), 1);
    let first = first[0].job.clone().unwrap();
    let listed = cli(&s, &["providers", "list"]).await.unwrap();
    assert!(listed.starts_with("PROVIDER  RATE/S  BURST"), "{listed}");
    let psp = row(&listed, "psp");
    assert_eq!(&psp[..6], ["psp", "80", "100", "1", "2", "payouts,refunds"]);
    assert!(psp[6].ends_with("/100"), "units available: {listed}");
    assert!(psp.contains(&"1/50"), "in flight: {listed}");
    assert_eq!(psp.last(), Some(&"alice"), "no pause: {listed}");
    let listed = json(&cli(&s, &["providers", "--json", "list"]).await.unwrap());
    let p = &listed["providers"][0];
    assert_eq!(p["name"], "psp");
    assert_eq!(p["rate_per_second"], 80.0);
    assert_eq!(
        (&p["burst"], &p["max_in_flight"], &p["execute_cost"]),
        (&100.into(), &50.into(), &1.into())
    );
    assert_eq!(p["reconcile_cost"], 2);
    assert_eq!(p["queues"], serde_json::json!(["payouts", "refunds"]));
    assert_eq!((&p["in_flight"], &p["pause"]), (&1.into(), &"none".into()));
    assert!(p["units_available"].as_u64().unwrap() <= 100);
    assert_eq!(p["updated_by"], "alice");

    // An incident: sends are held, and a claim hands out nothing.
    let paused = cli(
        &s,
        &[
            "providers",
            "pause",
            "psp",
            "--sends-only",
            "--reason",
            "INC-42: provider answers 5xx",
        ],
    )
    .await
    .unwrap();
    assert!(
        paused.starts_with("provider psp paused: sends held, reconciles go on\n"),
        "{paused}"
    );
    assert!(
        w.claim(claim("refunds"))
            .await
            .unwrap()
            .into_inner()
            .jobs
            .is_empty(),
        "a send was handed out while sends are paused"
    );
    let listed = cli(&s, &["providers", "list"]).await.unwrap();
    let psp = row(&listed, "psp");
    assert!(psp.contains(&"SENDS"), "{listed}");
    assert_eq!(
        psp.last(),
        Some(&"INC-42: provider answers 5xx"),
        "{listed}"
    );

    // The first worker meets a 429: the provider is throttled for a minute.
    w.fail(FailRequest {
        job_id: first.job_id,
        attempt: first.attempt,
        disposition: FailDisposition::RetryReconcile as i32,
        error: "429 Too Many Requests".into(),
        retry_delay: None,
        provider_retry_after: kit::secs(60),
        next: None,
    })
    .await
    .unwrap();
    let p = json(&cli(&s, &["providers", "--json", "list"]).await.unwrap())["providers"][0].clone();
    assert_eq!(p["pause"], "sends");
    assert_eq!(p["pause_reason"], "INC-42: provider answers 5xx");
    assert_ne!(p["throttled_until"], "", "{p}");
    assert_eq!(p["throttle_reports"], 1);

    // Resumed: the pause and the throttle end, and both jobs go out.
    let resumed = cli(
        &s,
        &["providers", "resume", "psp", "--reason", "INC-42 resolved"],
    )
    .await
    .unwrap();
    assert!(
        resumed.starts_with("provider psp resumed: hand-outs go on within the budget\n"),
        "{resumed}"
    );
    let p = json(&cli(&s, &["providers", "--json", "list"]).await.unwrap())["providers"][0].clone();
    assert_eq!(
        (&p["pause"], &p["pause_reason"], &p["throttled_until"]),
        (&"none".into(), &"".into(), &"".into())
    );
    assert_eq!(
        w.claim(claim("refunds"))
            .await
            .unwrap()
            .into_inner()
            .jobs
            .len(),
        2
    );

    // Another operator's name is refused, and nothing is recorded.
    let before = s.policy_rows().await;
    let refused = cli(
        &s,
        &[
            "providers",
            "pause",
            "psp",
            "--operator",
            "mallory",
            "--reason",
            "not me",
        ],
    )
    .await
    .unwrap_err();
    assert!(
        refused.starts_with("PermissionDenied OPERATOR_MISMATCH"),
        "{refused}"
    );
    assert_eq!(s.policy_rows().await, before);

    // A stored resend policy for one queue; the other follows the flags.
    let stored = cli(
        &s,
        &[
            "queue-policies",
            "set",
            "refunds",
            "--resend-window",
            "24h",
            "--max-dispatches",
            "3",
            "--reason",
            "Stripe keeps idempotency keys 24 h",
        ],
    )
    .await
    .unwrap();
    assert!(
        stored
            .starts_with("policy of queue refunds stored: resend window 24h, at most 3 dispatches"),
        "{stored}"
    );
    let policies = cli(&s, &["queue-policy", "list"]).await.unwrap();
    assert_eq!(
        row(&policies, "refunds")[..4],
        ["refunds", "psp", "24h", "3"]
    );
    assert_eq!(
        row(&policies, "payouts")[..4],
        ["payouts", "psp", "(flags)", "(flags)"]
    );
    let deleted = cli(
        &s,
        &[
            "queue-policies",
            "delete",
            "refunds",
            "--reason",
            "back to the flags",
        ],
    )
    .await
    .unwrap();
    assert!(
        deleted.starts_with("policy of queue refunds deleted: the coordinators'"),
        "{deleted}"
    );
    let policies = cli(&s, &["queue-policies", "list"]).await.unwrap();
    assert_eq!(row(&policies, "refunds")[2], "(flags)");
    let history = json(
        &cli(&s, &["queue-policies", "--json", "history", "refunds"])
            .await
            .unwrap(),
    );
    let actions: Vec<(&str, &str)> = history["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["action"].as_str().unwrap(),
                c["operator"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("delete_queue_policy", "alice"),
            ("put_queue_policy", "alice")
        ]
    );

    // The provider's history, newest first, each change with its operator.
    let history = cli(&s, &["providers", "history", "psp"]).await.unwrap();
    let lines: Vec<&str> = history.lines().collect();
    assert!(lines[0].starts_with("CHANGE  AT (UTC)"), "{history}");
    let changes: Vec<Vec<&str>> = lines[1..].iter().map(|l| cells(l)).collect();
    let summary: Vec<(&str, &str, &str, &str)> =
        changes.iter().map(|c| (c[2], c[3], c[4], c[5])).collect();
    assert_eq!(
        summary,
        [
            (
                "alice",
                "provider:psp",
                "resume_provider",
                "INC-42 resolved"
            ),
            (
                "alice",
                "provider:psp",
                "pause_provider",
                "INC-42: provider answers 5xx"
            ),
            (
                "alice",
                "provider:psp",
                "put_provider",
                "live 100 req/s, 80 % for jobfence"
            ),
        ],
        "{history}"
    );
    let page = json(
        &cli(&s, &["providers", "--json", "history", "--limit", "2"])
            .await
            .unwrap(),
    );
    assert_eq!(page["changes"].as_array().unwrap().len(), 2);
    let before = page["next_before"]
        .as_u64()
        .expect("a next page")
        .to_string();
    let rest = json(
        &cli(&s, &["providers", "--json", "history", "--before", &before])
            .await
            .unwrap(),
    );
    assert_eq!(rest["changes"].as_array().unwrap().len(), 3);
    assert!(rest["next_before"].is_null());

    let deleted = cli(
        &s,
        &[
            "providers",
            "delete",
            "psp",
            "--reason",
            "moved to another acquirer",
        ],
    )
    .await
    .unwrap();
    assert!(
        deleted.starts_with("provider psp deleted: queues payouts, refunds no longer limited"),
        "{deleted}"
    );
    let listed = cli(&s, &["providers", "list"]).await.unwrap();
    assert!(listed.starts_with("no providers"), "{listed}");
    let all = json(&cli(&s, &["providers", "--json", "history"]).await.unwrap());
    assert_eq!(all["changes"][0]["action"], "delete_provider");
    assert_eq!(all["changes"][0]["operator"], "alice");
    assert_eq!(all["changes"].as_array().unwrap().len(), 6);
    s.stop().await;
}

#[tokio::test]
async fn bad_provider_input_names_each_flag_and_writes_nothing() {
    let s = Secure::start(false).await;
    let set = |rate: &'static str, burst: &'static str, extra: &'static [&'static str]| {
        let mut args = vec![
            "providers",
            "set",
            "psp",
            "--rate",
            rate,
            "--burst",
            burst,
            "--queue",
            "refunds",
        ];
        args.extend_from_slice(extra);
        args
    };
    let refused = cli(
        &s,
        &set(
            "0",
            "0",
            &[
                "--max-in-flight",
                "0",
                "--reconcile-cost",
                "2",
                "--queue",
                "refunds",
                "--queue",
                "bad queue",
                "--reason",
                "try",
            ],
        ),
    )
    .await
    .unwrap_err();
    let mut lines = refused.lines();
    assert_eq!(
        lines.next(),
        Some("InvalidArgument INVALID_REQUEST: nothing was written; fix each field below"),
        "{refused}"
    );
    let fields: Vec<&str> = lines
        .map(|l| l.trim().split(": ").next().unwrap())
        .collect();
    for expected in [
        "budget.rate_per_second (--rate)",
        "budget.burst (--burst)",
        "budget.max_in_flight (--max-in-flight)",
        "queues[1] (--queue)",
        "queues[2] (--queue)",
    ] {
        assert!(fields.contains(&expected), "{expected} in:\n{refused}");
    }
    assert!(
        refused.contains("queues[1] (--queue): queue \"refunds\" is listed twice"),
        "{refused}"
    );
    assert!(
        refused.contains("budget.rate_per_second (--rate): must be a positive finite number"),
        "{refused}"
    );

    let blank = cli(&s, &set("10", "10", &["--reason", " "]))
        .await
        .unwrap_err();
    assert!(
        blank.contains("\n  reason (--reason): must not be blank"),
        "{blank}"
    );
    let ghost = cli(
        &s,
        &["providers", "pause", "ghost", "--reason", "who is this"],
    )
    .await
    .unwrap_err();
    assert!(
        ghost.contains("\n  name (NAME): no provider is named \"ghost\""),
        "{ghost}"
    );
    let policy = cli(
        &s,
        &[
            "queue-policies",
            "set",
            "refunds",
            "--resend-window",
            "40days",
            "--max-dispatches",
            "0",
            "--reason",
            "too long",
        ],
    )
    .await
    .unwrap_err();
    assert!(
        policy.contains("\n  resend_window (--resend-window): must be at most"),
        "{policy}"
    );
    assert!(
        policy.contains("\n  max_dispatches (--max-dispatches): must be between 1 and"),
        "{policy}"
    );
    // What clap refuses never reaches the coordinator.
    let typo = cli(&s, &set("fast", "10", &["--reason", "x"]))
        .await
        .unwrap_err();
    assert!(
        typo.contains("invalid value 'fast' for '--rate <RATE>'"),
        "{typo}"
    );
    let no_queue = cli(
        &s,
        &[
            "providers",
            "set",
            "psp",
            "--rate",
            "1",
            "--burst",
            "1",
            "--reason",
            "x",
        ],
    )
    .await
    .unwrap_err();
    assert!(no_queue.contains("--queue <QUEUES>"), "{no_queue}");
    assert_eq!(s.policy_rows().await, (0, 0, 0), "a refused call wrote");

    // A queue has one provider: giving it to a second is refused, and the
    // second provider is not created.
    cli(&s, &set("10", "10", &["--reason", "first"]))
        .await
        .unwrap();
    let taken = cli(
        &s,
        &[
            "providers",
            "set",
            "other",
            "--rate",
            "5",
            "--burst",
            "5",
            "--queue",
            "refunds",
            "--reason",
            "second",
        ],
    )
    .await
    .unwrap_err();
    assert!(
        taken.contains(
            "queues[0] (--queue): queue \"refunds\" already dispatches to provider \"psp\""
        ),
        "{taken}"
    );
    assert_eq!(s.policy_rows().await, (1, 1, 1));

    // Every provider call is an operator's: a worker may not even list.
    for args in [
        &["providers", "list"][..],
        &["providers", "pause", "psp", "--reason", "mine now"],
        &["queue-policies", "list"],
    ] {
        let denied = cli_as(&s, "refunds-worker", args).await.unwrap_err();
        assert!(
            denied.starts_with("PermissionDenied ROLE_NOT_ALLOWED"),
            "{args:?}: {denied}"
        );
    }
    assert_eq!(s.policy_rows().await, (1, 1, 1));
    s.stop().await;
}
