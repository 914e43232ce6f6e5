//! The fake payment provider, driven through the real client over loopback,
//! and the Rust refund worker meeting its rate limit.
//!
//! Time-dependent behaviour (retention, pending settlement, read lag, the
//! rate limit) is tested by advancing the provider's clock, never by
//! sleeping; injected latency and hangs are real time, bounded by the
//! client's timeout. The refund-worker tests at the end also need the test
//! database (an in-process coordinator, `crates/testkit/src`).

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

/// Runs `n` creates with distinct keys and says which were refused with 503.
async fn draw_5xx(client: &ProviderClient, n: usize) -> Vec<bool> {
    let mut refused = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("op-{i}");
        let r = client
            .create_refund(&key, &refund("pay_1", 1, &key), OK)
            .await;
        refused.push(matches!(r, Err(ProviderError::Unavailable { .. })));
    }
    refused
}

#[tokio::test]
async fn a_seeded_probability_injects_about_its_share_reproducibly() {
    let config = || ProviderConfig {
        faults: FaultConfig {
            error_5xx: 0.25,
            ..FaultConfig::default()
        },
        seed: Some(42),
        ..ProviderConfig::default()
    };
    let (_a, client_a) = provider(config()).await;
    let refused = draw_5xx(&client_a, 200).await;
    let count = refused.iter().filter(|r| **r).count();
    assert!(
        (25..=75).contains(&count),
        "{count} of 200 refused at p=0.25"
    );
    let made = client_a.ledger().await.unwrap().by_payment("pay_1").refunds;
    assert_eq!(made as usize, 200 - count, "a 503 never moves money");

    let (_b, client_b) = provider(config()).await;
    assert_eq!(
        draw_5xx(&client_b, 200).await,
        refused,
        "same seed, same faults"
    );
}

#[tokio::test]
async fn faults_are_read_and_replaced_at_run_time() {
    let (handle, client) = default_provider().await;
    assert_eq!(client.faults().await.unwrap(), FaultConfig::default());
    let all_5xx = FaultConfig {
        error_5xx: 1.0,
        latency_ms: 10,
        ..FaultConfig::default()
    };
    assert_eq!(client.set_faults(&all_5xx).await.unwrap(), all_5xx);
    assert_eq!(client.faults().await.unwrap(), all_5xx);

    let params = refund("pay_1", 500, "op-1");
    let err = client.create_refund("op-1", &params, OK).await.unwrap_err();
    assert!(matches!(err, ProviderError::Unavailable { .. }), "{err:?}");
    // The header overrides the probabilities: `none` means no fault.
    let calm = client.with_faults(&[]);
    calm.create_refund("op-1", &params, OK).await.unwrap();
    // Admin endpoints are never faulted.
    client.health().await.unwrap();

    let bad = FaultConfig {
        hang: 1.5,
        ..FaultConfig::default()
    };
    let err = client.set_faults(&bad).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Rejected { status: 400, .. }),
        "{err:?}"
    );

    let raw = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = raw
        .get(format!("{}v1/refunds", handle.base_url()))
        .header(FAULT_HEADER, "explode")
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        400,
        "a mistyped fault is refused, not ignored"
    );
}

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

fn expect_rate_limited(r: Result<impl std::fmt::Debug, ProviderError>) -> Option<Duration> {
    match r {
        Err(ref e @ ProviderError::RateLimited { retry_after, .. }) => {
            assert!(!e.refund_may_exist(), "a 429 did nothing");
            retry_after
        }
        other => panic!("expected a 429, got {other:?}"),
    }
}

#[tokio::test]
async fn a_burst_past_the_rate_limit_gets_exactly_the_excess_refused_and_nothing_recorded() {
    let (handle, client) = limited_provider(RateLimitConfig::per_second(5.0)).await;
    let keys: Vec<String> = (0..12).map(|i| format!("op-{i}")).collect();
    let mut burst = tokio::task::JoinSet::new();
    for key in &keys {
        let (client, key) = (client.clone(), key.clone());
        burst.spawn(async move {
            let r = client
                .create_refund(&key, &refund("pay_1", 500, &key), OK)
                .await;
            (key, r)
        });
    }
    let (mut made, mut refused) = (Vec::new(), Vec::new());
    while let Some(done) = burst.join_next().await {
        let (key, r) = done.unwrap();
        match r {
            Ok(_) => made.push(key),
            Err(ProviderError::RateLimited { retry_after, .. }) => refused.push((key, retry_after)),
            Err(e) => panic!("{key}: {e:?}"),
        }
    }
    // The clock stood still: the burst of 5 passed, the other 7 did not.
    assert_eq!((made.len(), refused.len()), (5, 7));
    for (key, retry_after) in &refused {
        assert_eq!(*retry_after, Some(Duration::from_millis(200)), "{key}");
    }
    let ledger = client.ledger().await.unwrap();
    assert_eq!(ledger.by_payment("pay_1").refunds, 5);
    for (key, _) in &refused {
        assert_eq!(ledger.by_merchant_reference(key).refunds, 0, "{key}");
    }
    // No key of a refused create was stored: other parameters are accepted
    // with it once the limit lets the request through.
    handle.clock().advance(Duration::from_millis(200));
    let (key, _) = &refused[0];
    let r = client
        .create_refund(key, &refund("pay_1", 400, key), OK)
        .await
        .expect("a refused key is new to the provider");
    assert_eq!(r.amount, 400);

    let stats = handle.stats();
    assert_eq!(
        (
            stats.requests,
            stats.rate_limited,
            stats.peak_requests_per_second
        ),
        (13, 7, 13),
        "every request in one second, refused ones counted"
    );
    assert_eq!(client.stats().await.unwrap(), stats, "GET /_admin/stats");
}

#[tokio::test]
async fn lookups_share_the_limit_and_it_refills_one_request_per_interval() {
    let (handle, client) = limited_provider(RateLimitConfig {
        rate_per_second: Some(2.0),
        burst: Some(3),
    })
    .await;
    let clock = handle.clock().clone();
    let made = client
        .create_refund("op-1", &refund("pay_1", 500, "op-1"), OK)
        .await
        .unwrap();
    client.get_refund(&made.id, OK).await.unwrap().unwrap();
    client.find_by_merchant_reference("op-1", OK).await.unwrap();
    // The burst of 3 is spent, by a create and two lookups.
    let wait = expect_rate_limited(client.find_by_payment_id("pay_1", OK).await);
    assert_eq!(wait, Some(Duration::from_millis(500)));
    expect_rate_limited(client.get_refund(&made.id, OK).await);

    clock.advance(Duration::from_millis(300));
    let wait = expect_rate_limited(
        client
            .create_refund("op-2", &refund("pay_2", 500, "op-2"), OK)
            .await,
    );
    assert_eq!(wait, Some(Duration::from_millis(200)), "what is left of it");
    clock.advance(Duration::from_millis(200));
    client
        .create_refund("op-2", &refund("pay_2", 500, "op-2"), OK)
        .await
        .expect("one interval later, one request");
    expect_rate_limited(client.find_by_merchant_reference("op-2", OK).await);

    // The wire: Retry-After in whole seconds (rounded up), and in ms.
    let raw = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = raw
        .get(format!("{}v1/refunds?payment_id=pay_1", handle.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(resp.headers()[RETRY_AFTER_MS_HEADER], "500");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limit");

    // Admin calls are neither limited nor counted.
    for _ in 0..5 {
        client.ledger().await.unwrap();
        client.health().await.unwrap();
    }
    let stats = client.stats().await.unwrap();
    assert_eq!((stats.requests, stats.rate_limited), (9, 5));
    assert_eq!(stats.peak_requests_per_second, 9, "all in the first second");
    assert_eq!(
        client.ledger().await.unwrap().by_payment("pay_2").refunds,
        1
    );
    // The next second starts its own count.
    clock.advance(Duration::from_secs(1));
    client.find_by_payment_id("pay_2", OK).await.unwrap();
    let stats = client.stats().await.unwrap();
    assert_eq!(
        (
            stats.requests,
            stats.rate_limited,
            stats.peak_requests_per_second
        ),
        (10, 5, 9)
    );
}

#[tokio::test]
async fn the_rate_limit_is_read_and_replaced_at_run_time() {
    let (handle, client) = limited_provider(RateLimitConfig::default()).await;
    assert_eq!(
        client.rate_limit().await.unwrap(),
        RateLimitConfig::default()
    );
    for i in 0..20 {
        let key = format!("op-{i}");
        client
            .create_refund(&key, &refund("pay_1", 1, &key), OK)
            .await
            .expect("no limit by default");
    }
    let set = client
        .set_rate_limit(&RateLimitConfig::per_second(0.5))
        .await
        .unwrap();
    assert_eq!(
        set,
        RateLimitConfig {
            rate_per_second: Some(0.5),
            burst: Some(1)
        },
        "the burst in force is returned"
    );
    assert_eq!(client.rate_limit().await.unwrap(), set);
    client.find_by_payment_id("pay_1", OK).await.unwrap();
    let wait = expect_rate_limited(client.find_by_payment_id("pay_1", OK).await);
    assert_eq!(wait, Some(Duration::from_secs(2)));

    for bad in [
        r#"{"rate_per_second": 0}"#,
        r#"{"rate_per_second": -1}"#,
        r#"{"rate_per_second": 1, "burst": 0}"#,
        r#"{"burst": 4}"#,
        r#"{"rate": 4}"#,
    ] {
        let raw = reqwest::Client::builder().no_proxy().build().unwrap();
        let resp = raw
            .put(format!("{}_admin/rate-limit", handle.base_url()))
            .body(bad)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{bad}");
    }
    assert_eq!(
        client.rate_limit().await.unwrap(),
        set,
        "bad limits change nothing"
    );

    // In process, and off again.
    assert!(handle
        .set_rate_limit(RateLimitConfig::per_second(f64::INFINITY))
        .is_err());
    handle.set_rate_limit(RateLimitConfig::default()).unwrap();
    client.find_by_payment_id("pay_1", OK).await.unwrap();
    let stats = handle.stats();
    assert_eq!((stats.requests, stats.rate_limited), (23, 1));
}

#[test]
fn fault_headers_and_probabilities_are_validated() {
    assert_eq!(parse_fault_header("none").unwrap(), []);
    assert_eq!(
        parse_fault_header("latency, lag").unwrap(),
        [FaultKind::Latency, FaultKind::Lag]
    );
    assert!(parse_fault_header("explode").is_err());
    let bad = ProviderConfig {
        pending_ratio: -0.1,
        ..ProviderConfig::default()
    };
    assert!(bad.validate().is_err());
    assert!(ProviderConfig::default().validate().is_ok());
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

/// A harness whose queue dispatches to the provider `fake` (a budget far
/// above what the test spends), and a fake provider whose one-request
/// burst is already spent, on a clock that stands still: its next `/v1`
/// request is refused with a Retry-After of exactly [`RETRY_AFTER`].
async fn throttling_provider() -> (
    kit::Harness,
    JobAdminClient<tonic::transport::Channel>,
    ProviderHandle,
    ProviderClient,
) {
    let h = kit::Harness::start().await;
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    admin
        .put_provider(PutProviderRequest {
            name: "fake".into(),
            budget: Some(ProviderBudget {
                rate_per_second: 1000.0,
                burst: 100,
                ..ProviderBudget::default()
            }),
            queues: vec![WORKER_QUEUE.into()],
            operator: "test".into(),
            reason: "the fake provider's budget".into(),
        })
        .await
        .expect("put the provider");
    let (handle, client) = limited_provider(RateLimitConfig::per_second(0.01)).await;
    client
        .find_by_merchant_reference("someone-else", OK)
        .await
        .expect("the one request of the burst");
    (h, admin, handle, client)
}

/// Claims the one due job with the SDK and lets the refund worker's handler
/// handle it.
async fn run_the_refund_worker(h: &kit::Harness, provider: &ProviderClient) {
    let worker = WorkerClient::connect(
        format!("http://{}", h.addr),
        WorkerConfig::new("rust-refund-worker", WORKER_QUEUE),
    )
    .await
    .unwrap();
    let mut jobs = worker.claim(1).await.expect("claim");
    assert_eq!(jobs.len(), 1, "one job is due");
    let handler = RefundHandler::new(provider.clone(), RefundTimings::default());
    handler
        .handle(&mut jobs[0])
        .await
        .expect("the handler writes back");
}

/// The provider's throttle as the coordinator stored it: reports received,
/// and how long from now (database clock) it holds hand-outs.
async fn stored_throttle(
    h: &kit::Harness,
    admin: &mut JobAdminClient<tonic::transport::Channel>,
) -> (u64, Duration) {
    let listed = admin
        .list_providers(ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner()
        .providers;
    assert_eq!(listed.len(), 1);
    let held_us: i64 = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), throttled_until) FROM providers WHERE name = 'fake'",
    )
    .fetch_one(&h.pool)
    .await
    .expect("the provider is throttled");
    (
        listed[0].throttle_reports,
        Duration::from_micros(u64::try_from(held_us).expect("in the future")),
    )
}

/// How long from now (database clock) the job is due again.
async fn due_in(h: &kit::Harness, job_id: u64) -> Duration {
    let us: i64 = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), run_at) FROM jobs WHERE id = ?",
    )
    .bind(job_id)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    Duration::from_micros(u64::try_from(us).expect("due in the future"))
}

/// Within the time the test took since the Fail: `d` counts down from
/// [`RETRY_AFTER`] on the database clock.
fn about_retry_after(d: Duration) -> bool {
    d <= RETRY_AFTER && d > RETRY_AFTER - Duration::from_secs(30)
}

const PAYLOAD: &str = r#"{"payment_id":"pay_1","amount":500,"currency":"twd"}"#;

#[tokio::test]
async fn the_refund_worker_reports_a_429_to_a_send_with_provider_retry_after() {
    let (h, mut admin, handle, provider) = throttling_provider().await;
    let job = h.enqueue(WORKER_QUEUE, "refund-pay_1-500", PAYLOAD).await;

    run_the_refund_worker(&h, &provider).await;

    // The send was refused before anything was done: the same send, later.
    let row = h.row(job.job_id).await;
    assert_eq!(
        (row.state, row.next_action),
        (JobState::Ready, NextAction::Execute)
    );
    assert!(
        row.last_error.as_deref().unwrap_or("").contains("429"),
        "{:?}",
        row.last_error
    );
    let due = due_in(&h, job.job_id).await;
    assert!(about_retry_after(due), "due again in {due:?}");
    // The Fail carried the provider's Retry-After: the coordinator holds
    // the provider's hand-outs for every worker until then.
    let (reports, held) = stored_throttle(&h, &mut admin).await;
    assert_eq!(reports, 1);
    assert!(about_retry_after(held), "held for {held:?}");
    assert_eq!(
        provider
            .ledger()
            .await
            .unwrap()
            .by_merchant_reference("refund-pay_1-500")
            .refunds,
        0
    );
    assert_eq!(handle.stats().rate_limited, 1);
    h.finish().await;
}

#[tokio::test]
async fn the_refund_worker_reports_a_429_to_a_lookup_with_provider_retry_after() {
    let (h, mut admin, handle, provider) = throttling_provider().await;
    let job = h.enqueue(WORKER_QUEUE, "refund-pay_1-500", PAYLOAD).await;
    // Its first worker vanished: the job comes back as a takeover, which
    // reconciles first.
    h.claim_one(WORKER_QUEUE, "vanished").await;
    h.force_lease_expired(job.job_id).await;

    run_the_refund_worker(&h, &provider).await;

    let row = h.row(job.job_id).await;
    assert_eq!(
        (row.state, row.next_action, row.attempt),
        (JobState::Ready, NextAction::Reconcile, 2),
        "a lookup refused is a reconcile still to do, never a send"
    );
    let due = due_in(&h, job.job_id).await;
    assert!(about_retry_after(due), "due again in {due:?}");
    let (reports, held) = stored_throttle(&h, &mut admin).await;
    assert_eq!(reports, 1);
    assert!(about_retry_after(held), "held for {held:?}");
    assert_eq!(handle.stats().rate_limited, 1);
    h.finish().await;
}

/// Handles the one due job of [`WORKER_QUEUE`] with the Rust refund
/// worker's handler (retry delays of zero, so the next hand-out is due at
/// once) and returns the provider requests it made.
async fn requests_of_one_hand_out(
    h: &kit::Harness,
    handle: &ProviderHandle,
    provider: &ProviderClient,
) -> (NextAction, u64) {
    let worker = WorkerClient::connect(
        format!("http://{}", h.addr),
        WorkerConfig::new("rust-refund-worker", WORKER_QUEUE),
    )
    .await
    .unwrap();
    let mut jobs = worker.claim(1).await.expect("claim");
    assert_eq!(jobs.len(), 1, "one job is due");
    let action = match jobs[0].next_action() {
        jobfence_worker::proto::NextAction::Reconcile => NextAction::Reconcile,
        _ => NextAction::Execute,
    };
    let timings = RefundTimings {
        reconcile_delay: Duration::ZERO,
        resend_delay: Duration::ZERO,
        ..RefundTimings::default()
    };
    let before = handle.stats().requests;
    RefundHandler::new(provider.clone(), timings)
        .handle(&mut jobs[0])
        .await
        .expect("the handler writes back");
    (action, handle.stats().requests - before)
}

// A provider budget can only keep a worker under the provider's limit if
// the cost of a hand-out covers every call the worker makes for it: the
// demo charges execute 1 and reconcile 2 for the refund workers' queue.
// Evidence handed over with a claim is checked with one lookup however
// many observations the job has, and a send never follows evidence the
// provider could not confirm in the same hand-out.
#[tokio::test]
async fn the_refund_worker_calls_the_provider_at_most_once_per_execute_and_twice_per_reconcile() {
    let h = kit::Harness::start().await;
    let (handle, provider) = default_provider().await;
    let job = h.enqueue(WORKER_QUEUE, "refund-pay_1-500", PAYLOAD).await;
    let first = h.claim_one(WORKER_QUEUE, "gone").await;
    // Two late receipts the provider cannot confirm (no such refunds).
    for reference in ["re_unknown_1", "re_unknown_2"] {
        h.client
            .clone()
            .record_observation(jobfence_api::v1::RecordObservationRequest {
                job_id: job.job_id,
                attempt: first.attempt,
                source: jobfence_api::v1::ObservationSource::Worker as i32,
                outcome: jobfence_api::v1::ObservationOutcome::Succeeded as i32,
                provider_reference: reference.into(),
                body: "{}".into(),
                dedup_key: format!("gone:{reference}"),
            })
            .await
            .expect("record the observation");
    }
    h.client
        .clone()
        .fail(jobfence_api::v1::FailRequest {
            job_id: job.job_id,
            attempt: first.attempt,
            disposition: jobfence_api::v1::FailDisposition::RetryExecute as i32,
            error: "gone".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .expect("a resend inside the window");

    // The send carries the evidence: one lookup, no send after it.
    assert_eq!(
        requests_of_one_hand_out(&h, &handle, &provider).await,
        (NextAction::Execute, 1)
    );
    let row = h.row(job.job_id).await;
    assert_eq!(
        (row.state, row.next_action),
        (JobState::Ready, NextAction::Reconcile),
        "evidence not confirmed: reconcile before any send"
    );
    // The reconcile: the evidence, then the lookup by merchant reference.
    assert_eq!(
        requests_of_one_hand_out(&h, &handle, &provider).await,
        (NextAction::Reconcile, 2)
    );
    assert_eq!(
        provider
            .ledger()
            .await
            .unwrap()
            .by_merchant_reference("refund-pay_1-500")
            .refunds,
        0,
        "nothing was sent"
    );
    h.finish().await;
}
