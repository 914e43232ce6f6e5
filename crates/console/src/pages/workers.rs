//! Workers: every worker a coordinator saw in the last 15 minutes, live or
//! stale, with its client, the coordinator of its latest call, its calls
//! per minute and the jobs it holds (docs/operating.md "Workers");
//! refreshed live. The queues page warns when a queue with ready jobs has
//! no live worker ([`no_live_worker`]).

use super::{refusal, view};
use crate::view::{age, job_link, Nav};
use crate::Console;
use jobfence_core::workers::{WorkerView, DEFAULT_STALE_AFTER, DEFAULT_WITHIN};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};
use std::time::Duration;

/// Seconds between two live refreshes.
const REFRESH_SECS: u32 = 5;

fn lease(left_us: i64) -> Markup {
    let d = Duration::from_micros(left_us.unsigned_abs());
    if left_us > 0 {
        html! { span.muted { "lease " (age(d)) " left" } }
    } else {
        html! { span.warn { "lease ended " (age(d)) " ago" } }
    }
}

fn row(w: &WorkerView) -> Markup {
    let state = if w.live { "live" } else { "stale" };
    html! {
        tr data-worker=(w.worker_id) data-state=(state) {
            td { strong { (w.worker_id) } }
            td { span class={ "badge " (state) } { (state) } }
            td { (w.client) }
            td { a href={ "/jobs?queue=" (w.queue) } { (w.queue) } }
            td { (age(w.last_call_ago)) " ago" }
            td.num { (w.calls_per_minute) }
            td { (w.coordinator) }
            td {
                @if w.held.is_empty() { span.muted { "nothing" } }
                @for j in &w.held {
                    div { (job_link(j.job_id)) " attempt " (j.attempt) " · " (lease(j.lease_left_us)) }
                }
            }
        }
    }
}

/// The live region: the table, or why it cannot be shown.
async fn table(console: &Console) -> Markup {
    let workers = match console
        .coordinator
        .workers(DEFAULT_STALE_AFTER, DEFAULT_WITHIN)
        .await
    {
        Ok(w) => w,
        Err(e) => return html! { div.notice.error { (refusal(&e).1.title) } },
    };
    let live = workers.iter().filter(|w| w.live).count();
    html! {
        p {
            strong { (live) " live" } ", " (workers.len() - live) " stale. "
            span.muted {
                "Stale: no call for " (age(DEFAULT_STALE_AFTER)) " and no lease running. "
                "Each coordinator writes what it saw every 5 s; a worker shows once it "
                "claims (or asks for its next job on a Complete or Fail). Updated "
                (chrono::Utc::now().format("%H:%M:%S")) " UTC."
            }
        }
        @if workers.is_empty() {
            p.empty { "No worker called any coordinator in the last 15 minutes." }
        } @else {
            table.workers {
                thead { tr {
                    th { "Worker" } th { "State" } th { "Client" } th { "Queue" }
                    th { "Last call" } th { "Calls/min" } th { "Coordinator" } th { "Holds" }
                } }
                tbody { @for w in &workers { (row(w)) } }
            }
        }
    }
}

/// `GET /workers`.
pub async fn page(State(console): State<Console>) -> Response {
    let body = html! {
        div.page-head {
            h1 { "Workers" }
            span.live-status data-for="workers-live" { "live" }
        }
        div #workers-live data-live="/workers/live" data-every=(REFRESH_SECS) {
            (table(&console).await)
        }
    };
    view::respond(
        StatusCode::OK,
        view::page("Workers", Nav::Workers, &[], body),
        [],
    )
}

/// `GET /workers/live`: the table alone, for the live refresh.
pub async fn live(State(console): State<Console>) -> Response {
    view::respond(StatusCode::OK, table(&console).await, [])
}

/// The queues among `queues` (those with ready jobs) that no live worker
/// called about last, nor holds a job of: nobody is taking their work.
pub fn no_live_worker<'a>(workers: &[WorkerView], queues: &'a [String]) -> Vec<&'a str> {
    let on = |w: &WorkerView, q: &str| w.queue == q || w.held.iter().any(|j| j.queue == q);
    queues
        .iter()
        .filter(|q| !workers.iter().any(|w| w.live && on(w, q)))
        .map(String::as_str)
        .collect()
}
