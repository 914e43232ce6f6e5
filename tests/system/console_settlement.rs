//! The Settlement page's action forms (docs/settlement.md),
//! over HTTP, the console acting as `alice`: an open exception is
//! acknowledged from its row and recorded under alice's name; the same
//! form posted again (the state it saw is gone) is refused with 409 and
//! nothing recorded; a post without the CSRF token and one naming no
//! state are refused, nothing recorded.

use crate::with_console;
use jobfence_console::csrf;
use jobfence_testkit::settlement::{import, line, provider_on, P};

/// Posts `fields` to exception `id`'s form; `with_csrf`: with a valid
/// token (cookie and field).
async fn post(
    console: &str,
    id: u64,
    fields: &[(&str, &str)],
    with_csrf: bool,
) -> reqwest::Response {
    let token = csrf::new_token();
    let mut body: Vec<(&str, &str)> = fields.to_vec();
    if with_csrf {
        body.push((csrf::FIELD, &token));
    }
    reqwest::Client::new()
        .post(format!("{console}/settlement/exceptions/{id}"))
        .header("cookie", format!("{}={token}", csrf::COOKIE_NAME))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(&body).unwrap())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_exception_is_acknowledged_from_its_row_and_a_stale_form_is_refused() {
    let s = with_console().await;
    provider_on(s.coordinator.store(), false).await;
    // A refund nobody enqueued: UNKNOWN_REFERENCE, open.
    let by_hand = line(1, "re_by_hand", "made-by-hand", 500, "succeeded");
    import(&s.coordinator, P, &[by_hand]).await;
    let id: u64 = sqlx::query_scalar("SELECT id FROM settlement_exceptions")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    let actions = || async {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT CAST(action AS CHAR), CAST(operator AS CHAR) \
             FROM settlement_exception_actions WHERE exception_id = ? ORDER BY id",
        )
        .bind(id)
        .fetch_all(&s.pool)
        .await
        .unwrap();
        rows
    };
    let console = format!("http://{}", s.console.unwrap());
    let page = reqwest::get(format!("{console}/settlement"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(&format!(r#"action="/settlement/exceptions/{id}""#)),
        "{page}"
    );
    assert!(page.contains(r#"value="acknowledged""#), "{page}");
    assert!(page.contains("as <strong>alice</strong>"), "{page}");

    let seen_open = [
        ("seen_state", "open"),
        ("to_state", "acknowledged"),
        ("note", "asked the PSP who made it"),
    ];
    let forged = post(&console, id, &seen_open, false).await;
    assert_eq!(forged.status(), reqwest::StatusCode::FORBIDDEN);
    let no_state = post(&console, id, &[("note", "x")], true).await;
    assert_eq!(no_state.status(), reqwest::StatusCode::BAD_REQUEST);
    let text = no_state.text().await.unwrap();
    assert!(text.contains("to state"), "{text}");
    assert_eq!(actions().await.len(), 1, "only its opening");

    let done = post(&console, id, &seen_open, true).await;
    assert_eq!(
        done.url().query(),
        Some(format!("acted={id}&state=acknowledged").as_str()),
        "{done:?}"
    );
    let text = done.text().await.unwrap();
    assert!(
        text.contains(&format!("Exception {id} is acknowledged now")),
        "{text}"
    );
    let acked = [
        ("opened".to_owned(), "settlement".to_owned()),
        ("acknowledged".to_owned(), "alice".to_owned()),
    ];
    assert_eq!(actions().await, acked);

    // The same form again: it saw the exception open, which it no longer is.
    let stale = post(&console, id, &seen_open, true).await;
    assert_eq!(stale.status(), reqwest::StatusCode::CONFLICT);
    let text = stale.text().await.unwrap();
    assert!(text.contains("someone acted first"), "{text}");
    assert_eq!(actions().await, acked, "nothing of the stale post recorded");
    s.stop().await;
}

/// A provider with more open exceptions than its card lists: the card
/// shows the newest 500 and says how many there are, never cutting the
/// list silently.
#[tokio::test]
async fn a_card_cut_at_its_limit_says_how_many_there_are() {
    let s = with_console().await;
    provider_on(s.coordinator.store(), false).await;
    let lines: Vec<_> = (1..=503)
        .map(|n| {
            line(
                n,
                &format!("re_hand_{n}"),
                &format!("by-hand-{n}"),
                500,
                "succeeded",
            )
        })
        .collect();
    import(&s.coordinator, P, &lines).await;
    let console = format!("http://{}", s.console.unwrap());
    let page = reqwest::get(format!("{console}/settlement"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Showing the newest 500 of 503"), "{page}");
    let rows = page.matches(r#"action="/settlement/exceptions/"#).count();
    assert_eq!(rows, 500, "the card lists the newest 500");
    s.stop().await;
}

/// The settlement scene of the console's browser test (console_browser.rs):
/// stripe's report read with the fake provider's preset (a lag of a day,
/// so the traffic's fresh successes are not yet missing), and a report of
/// one refunds job's key refunded twice (DOUBLE_REFUND, critical) and a
/// refund nobody enqueued (UNKNOWN_REFERENCE). The job's key, for the
/// browser to find its row.
pub async fn scene(pool: &sqlx::MySqlPool, coordinator: &jobfence_core::Coordinator) -> String {
    use jobfence_domain::providers::ChangeBy;
    use jobfence_domain::settlement::mapping::Mapping;
    use jobfence_domain::settlement::records::PutSettlementSettings;
    coordinator
        .put_settlement_settings(PutSettlementSettings {
            provider: "stripe".into(),
            preset: Some("fake".into()),
            mapping: Mapping::fake(),
            lag: std::time::Duration::from_secs(24 * 3600),
            queues: vec![],
            by: ChangeBy {
                operator: "dana".into(),
                reason: "the nightly report".into(),
            },
        })
        .await
        .unwrap();
    let key: String = sqlx::query_scalar(
        "SELECT CAST(operation_key AS CHAR) FROM jobs WHERE queue = 'refunds' \
         AND state = 'succeeded' ORDER BY id LIMIT 1",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let lines = [
        line(1, "re_first", &key, 500, "succeeded"),
        line(2, "re_second", &key, 500, "succeeded"),
        line(
            3,
            "re_by_hand",
            "made-by-hand-in-the-dashboard",
            900,
            "succeeded",
        ),
    ];
    import(coordinator, "stripe", &lines).await;
    key
}
