//! Jobs: filter by queue, state, age and operation_key (a prefix), oldest
//! first, paged by keyset (`after` = the last id shown), each row a link to
//! the job.

use super::{bad_input, refusal, view};
use crate::forms::{self, query_string, Pairs};
use crate::view::{ago, job_link, Nav};
use crate::Console;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use jobfence_domain::{Job, JobState};
use maud::{html, Markup};

fn filter_form(q: &Pairs) -> Markup {
    let v = |k: &str| forms::value(q, k).unwrap_or("").to_owned();
    let chosen: Vec<&str> = forms::values(q, "state").collect();
    let picked = |s: JobState| chosen.iter().any(|c| forms::state(c).ok() == Some(s));
    html! {
        form.filters method="get" action="/jobs" {
            label { "Queue" input type="text" name="queue" value=(v("queue")) placeholder="any"; }
            label {
                "State"
                select name="state" {
                    option value="any" { "any" }
                    @for s in JobState::ALL {
                        option value=(s.as_str()) selected[picked(s)] { (s.as_str().replace('_', " ")) }
                    }
                }
            }
            label { "Older than" input type="text" name="older_than" value=(v("older_than")) placeholder="e.g. 10m, 4h" size="8"; }
            label.grow { "operation_key starts with" input type="text" name="operation_key" value=(v("operation_key")) placeholder="e.g. refund-pay_42"; }
            button type="submit" { "Filter" }
            a href="/jobs" { "clear" }
        }
    }
}

fn table(jobs: &[Job]) -> Markup {
    html! {
        table.jobs {
            thead { tr {
                th { "Job" } th { "Queue" } th { "operation_key" } th { "Fairness key" } th.num { "Priority" } th { "State" }
                th.num { "Attempt" } th { "Next" } th.num { "Sent" } th { "Created" } th { "Reason / last error" }
            } }
            tbody {
                @for j in jobs {
                    tr data-job-id=(j.id) {
                        td { (job_link(j.id)) }
                        td { (j.queue) }
                        td.key { a href={ "/jobs/" (j.id) } { (j.operation_key) } }
                        td.key { (j.fairness_key.as_deref().unwrap_or_default()) }
                        td.num { (j.priority.get()) }
                        td { (view::state(j.state)) }
                        td.num { (j.attempt) }
                        td { @if matches!(j.state, JobState::Ready | JobState::Running) { (j.next_action.as_str()) } }
                        td.num { (j.dispatch_count) }
                        td title=(view::time(j.created_at)) { (ago(j.created_at)) " ago" }
                        td.clip title=[j.state_reason.as_deref()] {
                            (jobfence_domain::explain_state(j.state_reason.as_deref(), j.last_error.as_deref()).unwrap_or_default())
                        }
                    }
                }
            }
        }
    }
}

/// `GET /jobs?queue=&state=&older_than=&operation_key=&after=`.
pub async fn page(State(console): State<Console>, Query(q): Query<Pairs>) -> Response {
    let (filter, bad) = forms::jobs_filter(&q, forms::JOBS_PAGE);
    let mut notices = vec![];
    let mut status = StatusCode::OK;
    let mut listing = html! {};
    if !bad.is_empty() {
        notices.push(bad_input(&bad));
        status = StatusCode::BAD_REQUEST;
    } else {
        let (after, limit) = (filter.after_id, filter.limit);
        match console.coordinator.list_jobs(filter).await {
            Ok((jobs, next)) => {
                let keep: Vec<(&str, String)> = q
                    .iter()
                    .filter(|(k, _)| k != "after")
                    .map(|(k, v)| (k.as_str(), v.clone()))
                    .collect();
                let link = |after: Option<u64>| {
                    let mut pairs: Vec<(&str, &str)> =
                        keep.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    let a = after.map(|a| a.to_string()).unwrap_or_default();
                    pairs.push(("after", &a));
                    format!("/jobs?{}", query_string(&pairs))
                };
                listing = html! {
                    @if jobs.is_empty() {
                        p.empty { "No job matches." }
                    } @else {
                        (table(&jobs))
                    }
                    nav.pager {
                        @if after > 0 { a href=(link(None)) { "← first page" } }
                        @if let Some(next) = next { a.next href=(link(Some(next))) { "next " (limit) " →" } }
                    }
                };
            }
            Err(e) => {
                let (s, n) = refusal(&e);
                notices.push(n);
                status = s;
            }
        }
    }
    let body = html! {
        div.page-head { h1 { "Jobs" } span.muted { "oldest first" } a.button href="/jobs/bulk" { "Repair in bulk →" } }
        (filter_form(&q))
        (listing)
    };
    view::respond(status, view::page("Jobs", Nav::Jobs, &notices, body), [])
}
