//! Job: its fields, its observations, and its whole history as a timeline
//! that tells the seed's story top to bottom (claimed, frozen, taken over,
//! the zombie's write refused, its late success kept as evidence). A
//! parked job shows its evidence beside the resolution form first; a ready
//! job never sent, a cancel form (pages/cancel.rs).

use super::{refusal, resolve, view};
use crate::forms::{self, Pairs};
use crate::view::{when, Level, Nav, Notice};
use crate::{csrf, Console};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use jobfence_core::admin::JobDetail;
use jobfence_domain::{Job, JobState, Observation};
use maud::{html, Markup};

fn fields(j: &Job) -> Markup {
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let opt_time = |t: Option<jobfence_domain::DbTime>| match t {
        Some(t) => when(t),
        None => html! { span.muted { "—" } },
    };
    html! {
        dl.fields {
            dt { "Queue" } dd { (j.queue) }
            dt { "operation_key" } dd.key { (j.operation_key) }
            dt { "Fairness key" } dd.key {
                @if let Some(k) = &j.fairness_key { (k) } @else { span.muted { "none" } }
            }
            dt { "Priority" } dd { (j.priority.get()) span.muted { " (1 lowest to 9 most urgent)" } }
            dt { "State" } dd { (view::state(j.state)) @if let Some(r) = &j.state_reason { " " span.reason { (r) } } }
            dt { "Attempt" } dd { strong { (j.attempt) } span.muted { " (the fencing token; only this attempt may write)" } }
            @if !j.state.is_terminal() {
                dt { "Next action" } dd { (j.next_action.as_str()) }
                dt { "Due (run_at)" } dd { (when(j.run_at)) }
            }
            @if j.state == JobState::Running {
                dt { "Lease until" } dd { (opt_time(j.lease_until)) }
                dt { "Lease owner" } dd { (opt(&j.lease_owner)) }
            }
            dt { "Sent to the provider" } dd {
                (view::times(j.dispatch_count))
                @if j.first_dispatched_at.is_some() { ", first " (opt_time(j.first_dispatched_at)) }
            }
            dt { "Provider reference" } dd.key { (opt(&j.provider_reference)) }
            @if let Some(e) = &j.last_error { dt { "Last error" } dd { pre.inline { (e) } } }
            @if let Some(r) = &j.result { dt { "Result" } dd { pre.inline { (r) } } }
            dt { "Created" } dd { (when(j.created_at)) }
            dt { "Updated" } dd { (when(j.updated_at)) }
            @if let Some(f) = j.finished_at { dt { "Finished" } dd { (when(f)) } }
        }
    }
}

/// The observations of a job (evidence, never a write), oldest first.
pub fn observations(obs: &[Observation], current_attempt: u64) -> Markup {
    html! {
        @if obs.is_empty() {
            p.muted { "No observations." }
        } @else {
            table.obs {
                thead { tr { th { "Recorded" } th { "Source" } th { "Outcome" } th { "From attempt" } th { "Provider reference" } th { "Body" } } }
                tbody {
                    @for o in obs {
                        tr data-observation=(o.id) {
                            td { (when(o.recorded_at)) }
                            td { (o.source.as_str()) }
                            td { span class={ "outcome " (o.outcome.as_str()) } { (o.outcome.as_str().replace('_', " ")) } }
                            td {
                                (o.attempt)
                                @if o.attempt < current_attempt { " " span.stale title="This attempt was superseded: its result is kept as evidence, not written" { "stale" } }
                            }
                            td.key { (o.provider_reference.clone().unwrap_or_default()) }
                            td { pre.body { (o.body) } }
                        }
                    }
                }
            }
        }
    }
}

/// The page's body: for a parked job its evidence beside the resolve
/// form first, for a ready job never sent a cancel form; the fields, the
/// history, and the observations and settlement lines.
fn body(
    detail: &JobDetail,
    (settled, exceptions): (
        &[(String, jobfence_domain::settlement::SettlementLine)],
        &[jobfence_domain::settlement::records::SettlementException],
    ),
    token: &str,
    name: &crate::operator::OperatorField,
    prefill: Option<&Pairs>,
) -> Markup {
    let JobDetail {
        job,
        observations: obs,
        events,
    } = detail;
    let parked = job.state == JobState::ManualReview;
    html! {
        div.page-head {
            h1 { "Job " (job.id) }
            (view::state(job.state))
            span.key.muted { (job.operation_key) }
        }
        // A parked job: the evidence that decides it beside the form that
        // resolves it, at the top of the page.
        @if parked {
            div.columns.decide {
                section.card.evidence {
                    h2 { "Evidence " span.muted.small { "what the provider told workers, webhooks and reconcilers" } }
                    (observations(obs, job.attempt))
                    @if !settled.is_empty() || !exceptions.is_empty() {
                        (super::settlement::job_card(settled, exceptions))
                    }
                }
                section.card.resolve-card {
                    h2 { "Resolve" }
                    (resolve::form(job, token, name, prefill))
                }
            }
        }
        @if super::cancel::cancellable(job) {
            section.card.cancel-card {
                h2 { "Cancel" }
                (super::cancel::form(job, token, name))
            }
        }
        div.columns {
            section.card {
                h2 { "Job" }
                (fields(job))
                h3 { "Payload" }
                pre.payload { (job.payload) }
            }
            section.card {
                h2 { "History " span.muted.small { (events.len()) " events, oldest first" } }
                (view::timeline(events))
            }
        }
        @if !parked {
            section.card {
                h2 { "Observations " span.muted.small { "what the provider told workers, webhooks and reconcilers" } }
                (observations(obs, job.attempt))
            }
            @if !settled.is_empty() || !exceptions.is_empty() {
                (super::settlement::job_card(settled, exceptions))
            }
        }
    }
}

/// The Job page for `id`, with `notices` on top; `prefill` refills the
/// resolution form after a refused post.
pub async fn show(
    console: &Console,
    headers: &HeaderMap,
    id: u64,
    mut notices: Vec<Notice>,
    mut status: StatusCode,
    prefill: Option<&Pairs>,
) -> Response {
    let (token, set_csrf) = csrf::ensure(headers);
    let detail = match console.coordinator.job_detail(id).await {
        Ok(d) => d,
        Err(e) => {
            let (s, n) = refusal(&e);
            notices.push(n);
            let body = html! { p { a href="/jobs" { "← all jobs" } } };
            return view::respond(
                if status.is_success() { s } else { status },
                view::page(&format!("Job {id}"), Nav::Jobs, &notices, body),
                [],
            );
        }
    };
    let job = &detail.job;
    let name = console.operator_field(headers);
    // The provider's reports are evidence too: shown when there are any.
    let (settled, exceptions) = console
        .coordinator
        .job_settlement(job)
        .await
        .unwrap_or_default();
    let evidence = (settled.as_slice(), exceptions.as_slice());
    let body = body(&detail, evidence, &token, &name, prefill);
    if status == StatusCode::OK && notices.iter().any(|n| n.level == Level::Error) {
        status = StatusCode::BAD_REQUEST;
    }
    view::respond(
        status,
        view::page(&format!("Job {id}"), Nav::Jobs, &notices, body),
        [set_csrf],
    )
}

/// `GET /jobs/{id}` (`?resolved=1`, `?resolved=replay` or `?cancelled=1`
/// after a post).
pub async fn page(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    Query(q): Query<Pairs>,
) -> Response {
    let id = match forms::job_id(&raw) {
        Ok(id) => id,
        Err(e) => return super::not_found_job(&e),
    };
    let cancelled = forms::value(&q, "cancelled").is_some().then(|| {
        Notice::new(
            Level::Ok,
            format!("You cancelled job {id}; it will not be sent. Its history below ends with your cancel."),
        )
    });
    let notices = match forms::value(&q, "resolved") {
        Some("replay") => vec![Notice::new(
            Level::Ok,
            "This exact resolution had already been applied; nothing was written again.",
        )],
        Some(_) => vec![Notice::new(
            Level::Ok,
            format!("You resolved job {id}; its history below ends with your resolution."),
        )],
        None => cancelled.into_iter().collect(),
    };
    show(&console, &headers, id, notices, StatusCode::OK, None).await
}
