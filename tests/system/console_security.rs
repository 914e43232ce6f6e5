//! The console acts with its own operator credential: a coordinator with
//! TLS and the callers file, its console as `alice`. (The other security
//! tests are in tests/in_process/security.rs.)

use crate::with_console;
use jobfence_api::v1::{FailDisposition, FailRequest};

#[tokio::test]
async fn the_console_acts_with_its_operator_credential() {
    let s = with_console().await;
    let job = s.running("refund-1").await;
    let mut w = s.worker(Some("refunds-worker")).await;
    w.fail(FailRequest {
        job_id: job.job_id,
        attempt: job.attempt,
        disposition: FailDisposition::ManualReview as i32,
        error: "unknown at the provider".into(),
        retry_delay: None,
        provider_retry_after: None,
    })
    .await
    .unwrap();
    let console = format!("http://{}", s.console.unwrap());
    let http = reqwest::Client::new();
    // A page of another site whose name resolves to 127.0.0.1 (DNS
    // rebinding) is "same-origin" with itself: its requests name its host,
    // and are refused before any page or form is served.
    let csrf = jobfence_console::csrf::new_token();
    let rebound = "evil.example:9465";
    let read = http
        .get(format!("{console}/jobs/{}", job.job_id))
        .header("host", rebound)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), reqwest::StatusCode::MISDIRECTED_REQUEST);
    let before = s.counts().await;
    let posted = http
        .post(format!("{console}/jobs/{}/resolve", job.job_id))
        .header("host", rebound)
        .header("origin", format!("http://{rebound}"))
        .header(
            "cookie",
            format!("{}={csrf}", jobfence_console::csrf::COOKIE_NAME),
        )
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            serde_urlencoded::to_string([
                (jobfence_console::csrf::FIELD, csrf.as_str()),
                ("attempt", &job.attempt.to_string()),
                ("resolution", "failed"),
                ("reason", "rebinding"),
            ])
            .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), reqwest::StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(s.counts().await, before, "a rebound post wrote something");
    // The form names the credential's operator and asks for no name.
    let page = http
        .get(format!("{console}/jobs/{}", job.job_id))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("Recorded as <strong>alice</strong>"),
        "{page}"
    );
    assert!(!page.contains(r#"name="operator""#), "{page}");
    // A typed name is ignored: the resolution is alice's.
    let posted = http
        .post(format!("{console}/jobs/{}/resolve", job.job_id))
        .header(
            "cookie",
            format!("{}={csrf}", jobfence_console::csrf::COOKIE_NAME),
        )
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            serde_urlencoded::to_string([
                (jobfence_console::csrf::FIELD, csrf.as_str()),
                ("attempt", &job.attempt.to_string()),
                ("resolution", "failed"),
                ("operator", "mallory"),
                ("reason", "not refunded, confirmed with the provider"),
            ])
            .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert!(
        posted.status().is_redirection() || posted.status().is_success(),
        "{posted:?}"
    );
    let detail: String = sqlx::query_scalar(
        "SELECT CAST(detail AS CHAR) FROM job_events WHERE job_id = ? AND kind = 'manual_review_resolved'",
    )
    .bind(job.job_id)
    .fetch_one(&s.pool)
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(v["operator"], "alice");
    // Revoked, the console stops.
    s.revoke("alice");
    let refused = http.get(format!("{console}/queues")).send().await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::FORBIDDEN);
    s.stop().await;
}
