//! The fake provider's injected faults and rate limit, read and replaced at
//! run time: a seeded probability injects about its share reproducibly, a
//! burst past the limit gets exactly the excess refused with nothing
//! recorded, lookups share the limit, and fault settings are validated.
//! Time is the provider's clock, advanced by the tests, never a sleep.

use super::*;

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
