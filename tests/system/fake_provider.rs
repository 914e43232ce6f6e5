//! The fake payment provider, driven through the real client over loopback,
//! and the Rust refund worker meeting its rate limit.
//!
//! Time-dependent behaviour (retention, pending settlement, read lag, the
//! rate limit) is tested by advancing the provider's clock, never by
//! sleeping; injected latency and hangs are real time, bounded by the
//! client's timeout. The faults and the rate limit are in `faults`, the
//! refund worker meeting the limit in `refund_worker`.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{ListProvidersRequest, ProviderBudget, PutProviderRequest};
use jobfence_domain::{JobState, NextAction};
use jobfence_fake_provider::faults::parse_fault_header;
use jobfence_fake_provider::{
    spawn, Clock, FaultConfig, FaultKind, ProviderClient, ProviderConfig, ProviderError,
    ProviderHandle, RateLimitConfig, RefundParams, RefundStatus, FAULT_HEADER,
    IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER, RETRY_AFTER_MS_HEADER,
};
use jobfence_tools::refund_worker::handler::{RefundHandler, RefundTimings};
use jobfence_worker::{Handler, WorkerClient, WorkerConfig};
use std::io::BufRead;
use std::time::{Duration, Instant};

mod refund_worker;

mod faults;

/// A provider on a clock that moves only when the test moves it, limited
/// to `limit`.
async fn limited_provider(limit: RateLimitConfig) -> (ProviderHandle, ProviderClient) {
    provider(ProviderConfig {
        clock: Clock::manual(),
        rate_limit: limit,
        seed: Some(11),
        ..ProviderConfig::default()
    })
    .await
}

/// Generous timeout for calls that must succeed.
const OK: Duration = Duration::from_secs(10);

fn refund(payment_id: &str, amount: i64, reference: &str) -> RefundParams {
    RefundParams {
        payment_id: payment_id.to_owned(),
        amount,
        currency: "twd".to_owned(),
        merchant_reference: reference.to_owned(),
    }
}

async fn provider(config: ProviderConfig) -> (ProviderHandle, ProviderClient) {
    let handle = spawn(config).await.expect("spawning the fake provider");
    let client = handle.client();
    (handle, client)
}

async fn default_provider() -> (ProviderHandle, ProviderClient) {
    provider(ProviderConfig {
        seed: Some(1),
        ..ProviderConfig::default()
    })
    .await
}

#[tokio::test]
async fn idempotent_replay_returns_the_same_refund_and_moves_money_once() {
    let (handle, client) = default_provider().await;
    let params = refund("pay_1", 500, "op-1");
    let url = format!("{}v1/refunds", handle.base_url());
    let raw = reqwest::Client::builder().no_proxy().build().unwrap();
    let post = || {
        raw.post(&url)
            .header(IDEMPOTENCY_KEY_HEADER, "op-1")
            .json(&params)
    };

    let first = post().send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get(IDEMPOTENT_REPLAYED_HEADER).is_none());
    let first: jobfence_fake_provider::Refund = first.json().await.unwrap();
    assert!(first.id.starts_with("re_"));
    assert_eq!(first.status, RefundStatus::Succeeded);

    let again = client.create_refund("op-1", &params, OK).await.unwrap();
    assert_eq!(again, first);
    let replayed = post().send().await.unwrap();
    assert_eq!(replayed.headers()[IDEMPOTENT_REPLAYED_HEADER], "true");

    let ledger = client.ledger().await.unwrap();
    let entry = ledger.by_merchant_reference("op-1");
    assert_eq!((entry.refunds, entry.refunded_amount), (1, 500));
    assert_eq!(ledger.by_payment("pay_1").refunds, 1);
}

#[tokio::test]
async fn same_key_with_different_parameters_is_an_idempotency_error() {
    let (_handle, client) = default_provider().await;
    let original = client
        .create_refund("op-1", &refund("pay_1", 500, "op-1"), OK)
        .await
        .unwrap();

    let err = client
        .create_refund("op-1", &refund("pay_1", 900, "op-1"), OK)
        .await
        .unwrap_err();
    match &err {
        ProviderError::Rejected {
            status, error_type, ..
        } => assert_eq!((*status, error_type.as_str()), (400, "idempotency_error")),
        other => panic!("expected an idempotency_error, got {other:?}"),
    }
    assert!(!err.refund_may_exist());

    let ledger = client.ledger().await.unwrap();
    assert_eq!(ledger.by_payment("pay_1").refunded_amount, 500);
    let found = client.get_refund(&original.id, OK).await.unwrap();
    assert_eq!(found.map(|r| r.amount), Some(500));
}

#[tokio::test]
async fn a_create_without_idempotency_key_is_rejected_and_makes_nothing() {
    let (handle, client) = default_provider().await;
    let raw = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = raw
        .post(format!("{}v1/refunds", handle.base_url()))
        .json(&refund("pay_1", 500, "op-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(client.ledger().await.unwrap().payments.is_empty());
}

#[tokio::test]
async fn invalid_parameters_are_rejected() {
    let (_handle, client) = default_provider().await;
    for bad in [refund("pay_1", 0, "op-1"), refund("", 5, "op-1")] {
        let err = client.create_refund("k", &bad, OK).await.unwrap_err();
        assert!(
            matches!(err, ProviderError::Rejected { status: 400, ref error_type, .. } if error_type == "invalid_request_error"),
            "{err:?}"
        );
    }
    assert!(client.ledger().await.unwrap().payments.is_empty());
}

#[tokio::test]
async fn a_key_past_retention_is_forgotten_and_a_second_refund_is_made() {
    let (handle, client) = provider(ProviderConfig {
        idempotency_retention: Duration::from_secs(3600),
        seed: Some(2),
        ..ProviderConfig::default()
    })
    .await;
    let params = refund("pay_1", 500, "op-1");
    let first = client.create_refund("op-1", &params, OK).await.unwrap();

    handle.clock().advance(Duration::from_secs(3599));
    let inside = client.create_refund("op-1", &params, OK).await.unwrap();
    assert_eq!(inside.id, first.id, "inside the window: a replay");
    assert_eq!(
        client.ledger().await.unwrap().by_payment("pay_1").refunds,
        1
    );

    handle.clock().advance(Duration::from_secs(2));
    let after = client.create_refund("op-1", &params, OK).await.unwrap();
    assert_ne!(after.id, first.id, "past the window: a new refund");
    let entry = client.ledger().await.unwrap().by_merchant_reference("op-1");
    assert_eq!((entry.refunds, entry.refunded_amount), (2, 1000));
    let listed = client.find_by_merchant_reference("op-1", OK).await.unwrap();
    let ids: Vec<_> = listed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, [after.id.as_str(), first.id.as_str()], "newest first");
}

#[tokio::test]
async fn a_pending_refund_settles_after_pending_for() {
    let clock = Clock::new();
    let (_handle, client) = provider(ProviderConfig {
        pending_ratio: 1.0,
        pending_for: Duration::from_secs(30),
        clock: clock.clone(),
        seed: Some(3),
        ..ProviderConfig::default()
    })
    .await;
    let ok = client
        .create_refund("op-ok", &refund("pay_ok", 700, "op-ok"), OK)
        .await
        .unwrap();
    let bad = client
        .create_refund("op-bad", &refund("fail_pay", 300, "op-bad"), OK)
        .await
        .unwrap();
    assert_eq!(
        (ok.status, bad.status),
        (RefundStatus::Pending, RefundStatus::Pending)
    );
    let ledger = client.ledger().await.unwrap();
    let e = ledger.by_merchant_reference("op-ok");
    assert_eq!((e.refunds, e.pending), (1, 1), "pending counts as made");

    clock.advance(Duration::from_secs(29));
    let still = client.get_refund(&ok.id, OK).await.unwrap().unwrap();
    assert_eq!(still.status, RefundStatus::Pending);

    clock.advance(Duration::from_secs(2));
    let ok = client.get_refund(&ok.id, OK).await.unwrap().unwrap();
    let bad = client.get_refund(&bad.id, OK).await.unwrap().unwrap();
    assert_eq!(
        (ok.status, bad.status),
        (RefundStatus::Succeeded, RefundStatus::Failed)
    );
    let ledger = client.ledger().await.unwrap();
    let e = ledger.by_merchant_reference("op-ok");
    assert_eq!((e.refunds, e.refunded_amount, e.pending), (1, 700, 0));
    let e = ledger.by_merchant_reference("op-bad");
    assert_eq!((e.refunds, e.refunded_amount, e.failed), (0, 0, 1));
}

#[tokio::test]
async fn a_failing_payment_settles_failed_and_moves_no_money() {
    let (_handle, client) = default_provider().await;
    let r = client
        .create_refund("op-1", &refund("fail_card", 500, "op-1"), OK)
        .await
        .unwrap();
    assert_eq!(r.status, RefundStatus::Failed);
    let e = client.ledger().await.unwrap().by_payment("fail_card");
    assert_eq!((e.refunds, e.refunded_amount, e.failed), (0, 0, 1));
}

#[tokio::test]
async fn a_cut_response_is_connection_lost_but_the_refund_was_made() {
    let (_handle, client) = default_provider().await;
    let params = refund("pay_1", 500, "op-1");
    let err = client
        .with_faults(&[FaultKind::CutResponse])
        .create_refund("op-1", &params, OK)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::ConnectionLost { .. }),
        "{err:?}"
    );
    assert!(err.refund_may_exist());
    assert_eq!(
        client
            .ledger()
            .await
            .unwrap()
            .by_merchant_reference("op-1")
            .refunds,
        1
    );

    // Reconcile by merchant reference finds it; a resend with the same key
    // inside the window is a replay, not a second refund.
    let found = client.find_by_merchant_reference("op-1", OK).await.unwrap();
    assert_eq!(found.len(), 1);
    let resent = client.create_refund("op-1", &params, OK).await.unwrap();
    assert_eq!(resent.id, found[0].id);
    assert_eq!(
        client
            .ledger()
            .await
            .unwrap()
            .by_merchant_reference("op-1")
            .refunds,
        1
    );
}

#[tokio::test]
async fn an_injected_5xx_is_unavailable_and_records_nothing() {
    let (_handle, client) = default_provider().await;
    let err = client
        .with_faults(&[FaultKind::Error5xx])
        .create_refund("op-1", &refund("pay_1", 500, "op-1"), OK)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ProviderError::Unavailable {
                status: Some(503),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.refund_may_exist());
    assert!(client.ledger().await.unwrap().payments.is_empty());
    // The key was not even recorded: other parameters are accepted with it.
    let r = client
        .create_refund("op-1", &refund("pay_1", 400, "op-1"), OK)
        .await
        .unwrap();
    assert_eq!(r.amount, 400);
}

#[tokio::test]
async fn a_hang_times_out_and_makes_no_refund() {
    let (_handle, client) = default_provider().await;
    let started = Instant::now();
    let err = client
        .with_faults(&[FaultKind::Hang])
        .create_refund(
            "op-1",
            &refund("pay_1", 500, "op-1"),
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    assert_eq!(err, ProviderError::Timeout);
    assert!(
        started.elapsed() < OK,
        "the client's timeout ended the call"
    );
    assert!(client.ledger().await.unwrap().payments.is_empty());
}

#[tokio::test]
async fn latency_answers_late_after_the_refund_is_made() {
    let (_handle, client) = provider(ProviderConfig {
        faults: FaultConfig {
            latency_ms: 300,
            ..FaultConfig::default()
        },
        seed: Some(4),
        ..ProviderConfig::default()
    })
    .await;
    let slow = client.with_faults(&[FaultKind::Latency]);
    let err = slow
        .create_refund(
            "op-1",
            &refund("pay_1", 500, "op-1"),
            Duration::from_millis(100),
        )
        .await
        .unwrap_err();
    assert_eq!(err, ProviderError::Timeout);
    assert_eq!(
        client.ledger().await.unwrap().by_payment("pay_1").refunds,
        1
    );

    let started = Instant::now();
    slow.create_refund("op-2", &refund("pay_2", 500, "op-2"), OK)
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn lag_hides_a_fresh_refund_from_lookups_until_it_passes() {
    let (handle, client) = provider(ProviderConfig {
        faults: FaultConfig {
            lag_ms: 60_000,
            ..FaultConfig::default()
        },
        seed: Some(5),
        ..ProviderConfig::default()
    })
    .await;
    let made = client
        .create_refund("op-1", &refund("pay_1", 500, "op-1"), OK)
        .await
        .unwrap();
    let lagging = client.with_faults(&[FaultKind::Lag]);
    assert_eq!(lagging.get_refund(&made.id, OK).await.unwrap(), None);
    assert!(lagging
        .find_by_merchant_reference("op-1", OK)
        .await
        .unwrap()
        .is_empty());
    assert!(lagging
        .find_by_payment_id("pay_1", OK)
        .await
        .unwrap()
        .is_empty());
    // The ledger is the truth, never lagged.
    assert_eq!(
        client.ledger().await.unwrap().by_payment("pay_1").refunds,
        1
    );

    handle.clock().advance(Duration::from_secs(61));
    assert_eq!(
        lagging.get_refund(&made.id, OK).await.unwrap(),
        Some(made.clone())
    );
    assert_eq!(
        lagging
            .find_by_merchant_reference("op-1", OK)
            .await
            .unwrap(),
        [made]
    );
}

#[tokio::test]
async fn an_unknown_refund_is_none_not_an_error() {
    let (_handle, client) = default_provider().await;
    assert_eq!(client.get_refund("re_missing", OK).await.unwrap(), None);
}

#[tokio::test]
async fn an_unreachable_provider_is_unavailable_and_nothing_was_sent() {
    // A port that was just free: nothing listens there.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let client = ProviderClient::for_addr(addr);
    let err = client
        .create_refund("op-1", &refund("pay_1", 500, "op-1"), OK)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::Unavailable { status: None, .. }),
        "{err:?}"
    );
    assert!(!err.refund_may_exist());
}

/// Kills the child process when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_subcommand_prints_its_port_and_serves() {
    let mut child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_jobfence"))
            .args(["fake-provider", "--listen", "127.0.0.1:0", "--seed", "9"])
            .args(["--rate-limit", "0.5", "--rate-limit-burst", "3"])
            .env("JOBFENCE_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting jobfence fake-provider"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || {
            std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .find(|l| l.starts_with("listening on "))
        }),
    )
    .await
    .expect("the port line within 30s")
    .unwrap()
    .expect("a `listening on` line");
    let addr = line["listening on ".len()..].parse().unwrap();
    let client = ProviderClient::for_addr(addr);
    client.health().await.unwrap();
    let r = client
        .create_refund("op-1", &refund("pay_1", 500, "op-1"), OK)
        .await
        .unwrap();
    assert_eq!(r.status, RefundStatus::Succeeded);
    assert_eq!(
        client.rate_limit().await.unwrap(),
        RateLimitConfig {
            rate_per_second: Some(0.5),
            burst: Some(3)
        },
        "the flags set the limit"
    );
}

// The Rust refund worker against a provider past its rate limit: it must
// report the 429 with its Fail (provider_retry_after), so the coordinator
// holds every worker's hand-outs for the provider (docs/design.md rule 11).

const WORKER_QUEUE: &str = "refunds";
/// The provider's interval at 0.01 requests/s: a 429 asks for 100 s.
const RETRY_AFTER: Duration = Duration::from_secs(100);
