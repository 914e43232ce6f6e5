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
        next: None,
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

/// Posts the cancel form of job `id` (attempt `attempt`) with a valid
/// CSRF token; the response.
async fn post_cancel(console: &str, id: u64, attempt: u64, reason: &str) -> reqwest::Response {
    let csrf = jobfence_console::csrf::new_token();
    reqwest::Client::new()
        .post(format!("{console}/jobs/{id}/cancel"))
        .header(
            "cookie",
            format!("{}={csrf}", jobfence_console::csrf::COOKIE_NAME),
        )
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            serde_urlencoded::to_string([
                (jobfence_console::csrf::FIELD, csrf.as_str()),
                ("attempt", &attempt.to_string()),
                ("reason", reason),
            ])
            .unwrap(),
        )
        .send()
        .await
        .unwrap()
}

/// Cancel one job from its page: a ready job never sent shows the form and
/// is cancelled as the console's operator; a job claimed meanwhile is
/// refused by the fence (nothing written) and the page says why.
#[tokio::test]
async fn a_ready_job_is_cancelled_from_its_page_and_a_claimed_one_is_refused() {
    let s = with_console().await;
    let console = format!("http://{}", s.console.unwrap());
    let mut w = s.worker(Some("refunds-worker")).await;
    let enqueue = |key: &'static str| {
        let mut w = w.clone();
        async move {
            w.enqueue(jobfence_api::v1::EnqueueRequest {
                queue: "refunds".into(),
                operation_key: key.into(),
                payload: "{}".into(),
                delay: None,
                fairness_key: String::new(),
                priority: 0,
            })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap()
        }
    };
    let first = enqueue("refund-c1").await;
    let page = reqwest::get(format!("{console}/jobs/{}", first.job_id))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(r#"class="cancel""#),
        "the cancel form: {page}"
    );
    let done = post_cancel(&console, first.job_id, 0, "duplicate request").await;
    // Redirected (and followed) to the job's page, which says so.
    assert_eq!(done.url().query(), Some("cancelled=1"), "{done:?}");
    let text = done.text().await.unwrap();
    assert!(text.contains("You cancelled job"), "{text}");
    let (state, detail): (String, String) = sqlx::query_as(
        "SELECT CAST(j.state AS CHAR), CAST(e.detail AS CHAR) FROM jobs j \
         JOIN job_events e ON e.job_id = j.id AND e.kind = 'cancelled' WHERE j.id = ?",
    )
    .bind(first.job_id)
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!(state, "cancelled");
    assert!(
        detail.contains("alice") && detail.contains("duplicate request"),
        "{detail}"
    );
    // Loaded ready, claimed before the post: the fence refuses the cancel.
    let second = enqueue("refund-c2").await;
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
    let refused = post_cancel(&console, second.job_id, 0, "too late").await;
    assert_eq!(refused.status(), reqwest::StatusCode::CONFLICT);
    let text = refused.text().await.unwrap();
    assert!(text.contains("Not cancelled"), "{text}");
    let state: String = sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM jobs WHERE id = ?")
        .bind(second.job_id)
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(state, "running");
    s.stop().await;
}

/// The jobs list and the job page show each job's priority and fairness
/// key (docs/design.md rule 18); the key is a caller's text, shown as text
/// (escaped), never as markup.
#[tokio::test]
async fn the_jobs_list_and_the_job_page_show_the_priority_and_the_fairness_key_as_text() {
    let s = with_console().await;
    let console = format!("http://{}", s.console.unwrap());
    let w = s.worker(Some("shop")).await;
    let key = r#"<b id="m7">merchant & 7</b>"#;
    let enqueue = |operation_key: &'static str, fairness_key: &str, priority: u32| {
        let request = jobfence_api::v1::EnqueueRequest {
            queue: "refunds".into(),
            operation_key: operation_key.into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: fairness_key.into(),
            priority,
        };
        let mut w = w.clone();
        async move { w.enqueue(request).await.unwrap().into_inner().job.unwrap() }
    };
    let fair = enqueue("refund-f1", key, 8).await;
    let plain = enqueue("refund-f2", "", 0).await;
    let get = |path: String| {
        let url = format!("{console}{path}");
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let escaped = "&lt;b id=&quot;m7&quot;&gt;merchant &amp; 7&lt;/b&gt;";
    let list = get("/jobs?queue=refunds".into()).await;
    assert!(
        list.contains("Fairness key") && list.contains("Priority"),
        "{list}"
    );
    let row = |id: u64| {
        let start = list.find(&format!(r#"data-job-id="{id}""#)).unwrap();
        list[start..start + list[start..].find("</tr>").unwrap()].to_owned()
    };
    let fair_row = row(fair.job_id);
    assert!(fair_row.contains(escaped), "{fair_row}");
    assert!(fair_row.contains(r#"<td class="num">8</td>"#), "{fair_row}");
    assert!(!list.contains(key), "the key as markup: {list}");
    let plain_row = row(plain.job_id);
    assert!(
        plain_row.contains(r#"<td class="num">5</td>"#),
        "{plain_row}"
    );
    let page = get(format!("/jobs/{}", fair.job_id)).await;
    assert!(
        page.contains(&format!("Fairness key</dt><dd class=\"key\">{escaped}")),
        "{page}"
    );
    assert!(page.contains("Priority</dt><dd>8"), "{page}");
    assert!(!page.contains(key), "the key as markup: {page}");
    let page = get(format!("/jobs/{}", plain.job_id)).await;
    assert!(page.contains("Priority</dt><dd>5"), "{page}");
    assert!(
        page.contains(r#"Fairness key</dt><dd class="key"><span class="muted">none"#),
        "{page}"
    );
    s.stop().await;
}
