//! The console's Providers page, against a coordinator served with TLS
//! and the callers file: what it shows, its pause / resume / budget forms
//! (CSRF-checked, recorded as the console's operator), and a refused form
//! that writes nothing. (The CLI's side is in tests/in_process/provider_ops.rs.)

use crate::with_console;
use jobfence_api::v1::{
    PauseProviderRequest, ProviderBudget, PutProviderRequest, PutQueuePolicyRequest,
};
use jobfence_console::csrf;
use jobfence_testkit::secs;
use jobfence_testkit::secure::Secure;

/// A browser of the console: its CSRF cookie, and no redirects followed.
struct Browser {
    http: reqwest::Client,
    base: String,
    csrf: String,
}

impl Browser {
    fn new(s: &Secure) -> Browser {
        Browser {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: format!("http://{}", s.console.unwrap()),
            csrf: csrf::new_token(),
        }
    }

    async fn get(&self, path: &str) -> (reqwest::StatusCode, String) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", format!("{}={}", csrf::COOKIE_NAME, self.csrf))
            .send()
            .await
            .unwrap();
        (r.status(), r.text().await.unwrap())
    }

    /// Posts a form with the browser's cookie and `token` in the field.
    async fn post_with(&self, path: &str, token: &str, form: &[(&str, &str)]) -> reqwest::Response {
        let mut fields = vec![(csrf::FIELD, token)];
        fields.extend_from_slice(form);
        self.http
            .post(format!("{}{path}", self.base))
            .header("cookie", format!("{}={}", csrf::COOKIE_NAME, self.csrf))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(fields).unwrap())
            .send()
            .await
            .unwrap()
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        self.post_with(path, &self.csrf.clone(), form).await
    }
}

/// `(pause, pause_reason)` of a provider, as stored.
async fn stored_pause(s: &Secure, name: &str) -> (String, Option<String>) {
    sqlx::query_as(
        "SELECT CAST(pause AS CHAR), CAST(pause_reason AS CHAR) FROM providers WHERE name = ?",
    )
    .bind(name)
    .fetch_one(&s.pool)
    .await
    .unwrap()
}

/// `(operator, action, reason)` of the newest recorded change.
async fn last_change(s: &Secure) -> (String, String, String) {
    sqlx::query_as(
        "SELECT CAST(operator AS CHAR), CAST(action AS CHAR), CAST(reason AS CHAR) FROM policy_changes ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&s.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_console_shows_providers_and_pauses_one_as_its_operator() {
    let s = with_console().await;
    s.admin(Some("bob"))
        .await
        .put_provider(PutProviderRequest {
            name: "psp".into(),
            budget: Some(ProviderBudget {
                rate_per_second: 80.0,
                burst: 100,
                max_in_flight: Some(50),
                execute_cost: None,
                reconcile_cost: Some(2),
                key_share: None,
                max_in_flight_per_key: None,
            }),
            queues: vec!["refunds".into()],
            operator: String::new(),
            reason: "Stripe live 100 req/s, keep 20 %".into(),
        })
        .await
        .unwrap();
    s.admin(Some("bob"))
        .await
        .put_queue_policy(PutQueuePolicyRequest {
            queue: "refunds".into(),
            resend_window: secs(86_400),
            max_dispatches: Some(3),
            job_retention: None,
            operator: String::new(),
            reason: "Stripe keeps idempotency keys 24 h".into(),
        })
        .await
        .unwrap();
    let b = Browser::new(&s);

    let (status, page) = b.get("/providers").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{page}");
    assert!(
        page.contains(r#"<a href="/providers" class="active">Providers</a>"#),
        "navigation: {page}"
    );
    assert!(
        page.contains(r#"data-provider="psp" data-pause="none""#),
        "{page}"
    );
    assert!(page.contains("handing out within the budget"), "{page}");
    assert!(page.contains("80/s · burst 100"), "{page}");
    assert!(
        page.contains("1 / 2 <span class=\"small muted\">units"),
        "{page}"
    );
    assert!(page.contains(r#"action="/providers/psp/pause""#), "{page}");
    assert!(
        !page.contains(r#"action="/providers/psp/resume""#),
        "not paused: {page}"
    );
    assert!(
        page.contains("Recorded as <strong>alice</strong>"),
        "{page}"
    );
    assert!(!page.contains(r#"name="operator""#), "{page}");
    // The recent changes name who made them.
    assert!(page.contains(r#"data-action="put_provider""#), "{page}");
    assert!(page.contains("<strong>bob</strong>"), "{page}");
    // The stored queue policies.
    assert!(
        page.contains(r#"<tr data-queue="refunds"><td><a href="/jobs?queue=refunds">refunds</a></td><td>psp</td><td>24h</td><td class="num">3</td>"#),
        "{page}"
    );

    // No GET changes anything.
    let (status, _) = b.get("/providers/psp/pause").await;
    assert_eq!(status, reqwest::StatusCode::METHOD_NOT_ALLOWED);

    // A post whose field does not match the browser's cookie is refused.
    let before = s.policy_rows().await;
    let forged = b
        .post_with(
            "/providers/psp/pause",
            &csrf::new_token(),
            &[("pause", "all"), ("reason", "forged")],
        )
        .await;
    assert_eq!(forged.status(), reqwest::StatusCode::FORBIDDEN);
    assert!(forged.text().await.unwrap().contains("security token"));
    assert_eq!(s.policy_rows().await, before, "a forged post wrote");
    assert_eq!(stored_pause(&s, "psp").await, ("none".to_owned(), None));

    // Pause sends only; a typed name is ignored: the change is alice's.
    let paused = b
        .post(
            "/providers/psp/pause",
            &[
                ("pause", "sends"),
                ("operator", "mallory"),
                ("reason", "INC-7: refunds API 5xx"),
            ],
        )
        .await;
    assert_eq!(paused.status(), reqwest::StatusCode::SEE_OTHER);
    let to = paused.headers()["location"].to_str().unwrap().to_owned();
    assert_eq!(to, "/providers?done=paused_sends&provider=psp#provider-psp");
    assert_eq!(
        stored_pause(&s, "psp").await,
        (
            "sends".to_owned(),
            Some("INC-7: refunds API 5xx".to_owned())
        )
    );
    assert_eq!(
        last_change(&s).await,
        (
            "alice".to_owned(),
            "pause_provider".to_owned(),
            "INC-7: refunds API 5xx".to_owned()
        )
    );
    let (_, page) = b.get(to.split('#').next().unwrap()).await;
    assert!(page.contains("Provider psp is paused for sends"), "{page}");
    assert!(
        page.contains(r#"data-provider="psp" data-pause="sends""#),
        "{page}"
    );
    assert!(
        page.contains("PAUSED: sends held, reconciles go on"),
        "{page}"
    );
    assert!(
        page.contains("Why paused: <strong>INC-7: refunds API 5xx</strong>"),
        "{page}"
    );
    assert!(page.contains(r#"action="/providers/psp/resume""#), "{page}");
    // Where the work waits, it says why: the queues page holds the
    // refunds queue's ready job with the pause, who and since when.
    s.worker(Some("refunds-worker"))
        .await
        .enqueue(jobfence_api::v1::EnqueueRequest {
            queue: "refunds".into(),
            operation_key: "refund-held-1".into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap();
    let (_, page) = b.get("/queues").await;
    assert!(page.contains(r#"data-hold="SENDS_PAUSED""#), "{page}");
    assert!(
        page.contains(
            "1 ready held: </strong>provider psp paused for sends (reconciles go on): INC-7: refunds API 5xx (by alice since "
        ),
        "{page}"
    );

    // A budget the coordinator refuses: every bad field, nothing written,
    // the form open again with what was typed.
    let before = s.policy_rows().await;
    let refused = b
        .post(
            "/providers/psp/budget",
            &[
                ("rate_per_second", "0"),
                ("burst", "1"),
                ("reconcile_cost", "2"),
                ("queues", "refunds"),
                ("reason", "typo"),
            ],
        )
        .await;
    assert_eq!(refused.status(), reqwest::StatusCode::BAD_REQUEST);
    let page = refused.text().await.unwrap();
    assert!(
        page.contains("rate per second: must be a positive finite number"),
        "{page}"
    );
    assert!(
        page.contains("burst: must be at least the largest cost (2 units)"),
        "{page}"
    );
    assert!(page.contains(r#"<details class="budget" open>"#), "{page}");
    assert!(
        page.contains(r#"name="rate_per_second" value="0""#),
        "{page}"
    );
    assert_eq!(s.policy_rows().await, before, "a refused budget wrote");
    let not_a_number = b
        .post(
            "/providers/psp/budget",
            &[
                ("rate_per_second", "fast"),
                ("burst", "10"),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(not_a_number.status(), reqwest::StatusCode::BAD_REQUEST);
    assert!(not_a_number
        .text()
        .await
        .unwrap()
        .contains("rate per second: &quot;fast&quot; is not a number"));
    assert_eq!(s.policy_rows().await, before);

    // A budget edit, then resume.
    let edited = b
        .post(
            "/providers/psp/budget",
            &[
                ("rate_per_second", "40"),
                ("burst", "60"),
                ("max_in_flight", ""),
                ("execute_cost", "1"),
                ("reconcile_cost", "2"),
                ("queues", "refunds, payouts"),
                ("reason", "halved during INC-7"),
            ],
        )
        .await;
    assert_eq!(edited.status(), reqwest::StatusCode::SEE_OTHER);
    let (rate, burst, cap): (f64, u32, Option<u32>) = sqlx::query_as(
        "SELECT rate_per_second, burst, max_in_flight FROM providers WHERE name = 'psp'",
    )
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!((rate, burst, cap), (40.0, 60, None));
    assert_eq!(last_change(&s).await.1, "put_provider");
    let resumed = b
        .post("/providers/psp/resume", &[("reason", "INC-7 resolved")])
        .await;
    assert_eq!(resumed.status(), reqwest::StatusCode::SEE_OTHER);
    assert_eq!(stored_pause(&s, "psp").await, ("none".to_owned(), None));
    assert_eq!(
        last_change(&s).await,
        (
            "alice".to_owned(),
            "resume_provider".to_owned(),
            "INC-7 resolved".to_owned()
        )
    );

    // A new provider from the console; the same name again is refused.
    let added = b
        .post(
            "/providers",
            &[
                ("name", "acquirer"),
                ("rate_per_second", "5"),
                ("burst", "5"),
                ("queues", "chargebacks"),
                ("reason", "their contract: 5 req/s"),
            ],
        )
        .await;
    assert_eq!(added.status(), reqwest::StatusCode::SEE_OTHER);
    let again = b
        .post(
            "/providers",
            &[
                ("name", "acquirer"),
                ("rate_per_second", "50"),
                ("burst", "50"),
                ("reason", "oops"),
            ],
        )
        .await;
    assert_eq!(again.status(), reqwest::StatusCode::CONFLICT);
    let rate: f64 =
        sqlx::query_scalar("SELECT rate_per_second FROM providers WHERE name = 'acquirer'")
            .fetch_one(&s.pool)
            .await
            .unwrap();
    assert_eq!(rate, 5.0);

    // Paused for everything: marked as such.
    s.admin(Some("alice"))
        .await
        .pause_provider(PauseProviderRequest {
            name: "acquirer".into(),
            pause: jobfence_api::v1::ProviderPause::All as i32,
            operator: String::new(),
            reason: "contract renegotiation".into(),
        })
        .await
        .unwrap();
    let (_, page) = b.get("/providers").await;
    assert!(
        page.contains(r#"data-provider="acquirer" data-pause="all""#),
        "{page}"
    );
    assert!(page.contains("PAUSED: nothing is handed out"), "{page}");
    assert!(page.contains("1 paused"), "{page}");
    s.stop().await;
}
