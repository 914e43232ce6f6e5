//! Manual review: the parked jobs, oldest first, each with its evidence
//! (why it was parked, what the provider told whom, the last events) and
//! the form to resolve it with the attempt shown.

use super::{refusal, resolve, view};
use crate::forms::{self, query_string, Pairs};
use crate::operator::OperatorField;
use crate::view::{ago, Nav, Notice};
use crate::{csrf, Console};
use jobfence_core::admin::JobDetail;
use jobfence_domain::admin::ListJobsFilter;
use jobfence_domain::JobState;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{html, Markup};

/// Events shown with each parked job (the full history is on its page).
const LAST_EVENTS: usize = 6;

fn parked(d: &JobDetail, token: &str, name: &OperatorField) -> Markup {
    let j = &d.job;
    let tail = d.events.len().saturating_sub(LAST_EVENTS);
    html! {
        section.card.parked data-job-id=(j.id) {
            div.card-head {
                h2 { a href={ "/jobs/" (j.id) } { "Job " (j.id) } }
                span.key { (j.operation_key) }
                span.muted { "queue " (j.queue) " · parked " (ago(j.updated_at)) " ago · attempt " (j.attempt) " · sent " (view::times(j.dispatch_count)) }
            }
            @if let Some(why) = jobfence_domain::explain_state(j.state_reason.as_deref(), j.last_error.as_deref()) {
                p.reason { "Why parked: " strong { (why) } }
            }
            @if let Some(r) = &j.state_reason { p.muted.small { "reason code " code { (r) } } }
            div.columns {
                div {
                    h3 { "Evidence" }
                    (super::job::observations(&d.observations, j.attempt))
                    h3 { "Last events" @if tail > 0 { " " a.small href={ "/jobs/" (j.id) } { "(all " (d.events.len()) ")" } } }
                    (view::timeline(&d.events[tail..]))
                }
                div { (resolve::form(j, token, name, None)) }
            }
        }
    }
}

/// `GET /review?queue=&after=`.
pub async fn page(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Pairs>,
) -> Response {
    let (token, set_csrf) = csrf::ensure(&headers);
    let name = console.operator_field(&headers);
    let queue = forms::value(&q, "queue").map(str::to_owned);
    let mut notices: Vec<Notice> = vec![];
    let mut status = StatusCode::OK;
    let after = match forms::cursor(&q, "after") {
        Ok(a) => a.unwrap_or(0),
        Err(bad) => {
            notices.push(super::bad_input(&[bad]));
            status = StatusCode::BAD_REQUEST;
            0
        }
    };
    let filter = ListJobsFilter {
        queue: queue.clone(),
        states: vec![JobState::ManualReview],
        after_id: after,
        limit: forms::REVIEW_PAGE,
        ..Default::default()
    };
    let mut cards = vec![];
    let mut next = None;
    match console.coordinator.list_jobs(filter).await {
        Ok((jobs, more)) => {
            next = more;
            for j in jobs {
                match console.coordinator.job_detail(j.id).await {
                    Ok(d) => cards.push(d),
                    // Resolved or gone between the two reads: not parked any more.
                    Err(jobfence_domain::CoordinatorError::JobNotFound { .. }) => {}
                    Err(e) => {
                        let (s, n) = refusal(&e);
                        notices.push(n);
                        status = s;
                        break;
                    }
                }
            }
        }
        Err(e) => {
            let (s, n) = refusal(&e);
            notices.push(n);
            status = s;
        }
    }
    let q_owned = queue.clone().unwrap_or_default();
    let body = html! {
        div.page-head {
            h1 { "Manual review" }
            span.muted { "parked jobs, oldest first; only an operator's recorded resolution moves them" }
            form.inline method="get" action="/review" {
                label for="queue" { "Queue" }
                input #queue type="text" name="queue" value=(q_owned) placeholder="any";
                button type="submit" { "Show" }
            }
        }
        @if cards.is_empty() && status.is_success() {
            p.empty { "Nothing is waiting for an operator." }
        }
        @for d in &cards { (parked(d, &token, &name)) }
        nav.pager {
            @if after > 0 { a href={ "/review?" (query_string(&[("queue", &q_owned)])) } { "← first page" } }
            @if let Some(n) = next {
                a.next href={ "/review?" (query_string(&[("queue", &q_owned), ("after", &n.to_string())])) } { "next " (forms::REVIEW_PAGE) " →" }
            }
        }
    };
    view::respond(
        status,
        view::page("Manual review", Nav::Review, &notices, body),
        [set_csrf],
    )
}
