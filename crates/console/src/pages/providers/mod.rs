//! Providers: each provider's budget (docs/design.md rules 11–13) and what is
//! left of it now, its queues, jobs in flight, pause and throttle; the
//! forms to pause it (everything, or sends only while reconciles go on),
//! resume it and edit its budget, each with a recorded reason; the stored
//! queue policies; and the recent changes with who made them.
//!
//! Every form posts behind [`crate::csrf`] and goes through the
//! same coordinator calls as `JobAdmin`'s PauseProvider, ResumeProvider
//! and PutProvider, so the change is stored in the database, reaches every
//! coordinator from its next claim, and is recorded under the console's
//! operator. No GET changes anything, and the page does not refresh itself
//! (it holds forms): reload it to see the budget move.
//!
//! Here the page itself (`GET /providers`); `cards` what it shows,
//! `actions` the forms on it, `posts` what they post to.

mod actions;
mod cards;
mod posts;

pub use posts::{budget, create, pause, resume};

use super::{refusal, view};
use crate::forms::{self, Pairs};
use crate::view::{Level, Nav, Notice};
use crate::{csrf, Console};
use actions::{budget_form, Prefill};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use cards::{card, changes, queue_policies};
use jobfence_domain::budget::Pause;
use jobfence_domain::CoordinatorError;
use maud::html;

/// Changes shown at the bottom of the page.
const RECENT_CHANGES: u32 = 20;

/// The page, with `notices` on top; `prefill` refills the form a refused
/// post came from.
async fn show(
    console: &Console,
    headers: &HeaderMap,
    mut notices: Vec<Notice>,
    mut status: StatusCode,
    prefill: Option<&Prefill<'_>>,
) -> Response {
    let (token, set_csrf) = csrf::ensure(headers);
    let name = console.operator_field(headers);
    let mut fail = |e: &CoordinatorError, notices: &mut Vec<Notice>| {
        let (s, n) = refusal(e);
        notices.push(n);
        if status.is_success() {
            status = s;
        }
    };
    let providers = match console.coordinator.list_providers().await {
        Ok(p) => p,
        Err(e) => {
            fail(&e, &mut notices);
            vec![]
        }
    };
    let policies = match console.coordinator.list_queue_policies().await {
        Ok(p) => p,
        Err(e) => {
            fail(&e, &mut notices);
            vec![]
        }
    };
    let recent = match console
        .coordinator
        .list_policy_changes(None, None, RECENT_CHANGES)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            fail(&e, &mut notices);
            vec![]
        }
    };
    let paused = providers.iter().filter(|p| p.pause != Pause::None).count();
    let body = html! {
        div.page-head {
            h1 { "Providers" }
            span.muted { "budgets shared by every coordinator (database clock); a change applies from the next claim" }
            @if paused > 0 { span.badge.paused-all { (paused) " paused" } }
            a.button href="/providers" { "Reload" }
        }
        @if providers.is_empty() && status.is_success() {
            p.empty { "No providers: every queue is handed out without a budget. Add one below, or with " code { "jobfence providers set" } "." }
        }
        @for p in &providers { (card(p, &token, &name, prefill)) }
        section.card.new-provider { (budget_form(None, &token, &name, prefill)) }
        section.card {
            h2 { "Queue policies" }
            (queue_policies(&policies))
        }
        section.card {
            h2 { "Recent changes " span.muted.small { "newest first; " code { "jobfence providers history" } " has them all" } }
            (changes(&recent))
        }
    };
    if status == StatusCode::OK && notices.iter().any(|n| n.level == Level::Error) {
        status = StatusCode::BAD_REQUEST;
    }
    view::respond(
        status,
        view::page("Providers", Nav::Providers, &notices, body),
        [set_csrf],
    )
}

/// `GET /providers` (`?done=…&provider=…` after a post).
pub async fn page(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Pairs>,
) -> Response {
    let who = forms::value(&q, "provider").unwrap_or("");
    let done = match forms::value(&q, "done") {
        Some("paused_all") => Some(format!(
            "Provider {who} is paused: nothing is handed out for its queues until it is resumed."
        )),
        Some("paused_sends") => Some(format!(
            "Provider {who} is paused for sends: reconciles go on within the budget, sends wait until it is resumed."
        )),
        Some("resumed") => Some(format!(
            "Provider {who} is resumed: its jobs are handed out within the budget again."
        )),
        Some("created") => Some(format!("Provider {who} is added.")),
        Some("updated") => Some(format!("The budget of {who} is stored.")),
        _ => None,
    };
    let notices = done
        .map(|d| {
            vec![Notice::new(Level::Ok, d).with_lines([
                "Stored in the database: every coordinator applies it from its next claim. The change is recorded below."
                    .to_owned(),
            ])]
        })
        .unwrap_or_default();
    show(&console, &headers, notices, StatusCode::OK, None).await
}
