//! Resolving a parked job: the form (on the Job and Manual review pages)
//! and its post.
//!
//! The form carries the attempt the operator saw. The coordinator fences
//! the resolution on it like any worker write, so of two operators who
//! loaded the same parked job, the first to post wins and the second is
//! told who was first and what the job is now (JOB_NOT_IN_MANUAL_REVIEW),
//! on the job's page, with the job's fresh state and history under it.

use super::{bad_input, job, refusal};
use crate::forms::{self, Pairs};
use crate::operator::OperatorField;
use crate::view::{Level, Notice};
use crate::{csrf, operator, Console};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use jobfence_domain::EventKind;
use jobfence_domain::{CoordinatorError, Job};
use maud::{html, Markup};

/// The resolution form for `job`, as the operator sees it now.
pub fn form(
    job: &Job,
    csrf_token: &str,
    operator: &OperatorField,
    prefill: Option<&Pairs>,
) -> Markup {
    let id = job.id;
    let old = |k: &str| prefill.and_then(|p| forms::value(p, k)).unwrap_or("");
    let chosen = old("resolution");
    let choice = |value: &str, label: &str, hint: &str| {
        html! {
            label.choice {
                input type="radio" name="resolution" value=(value) checked[chosen == value] required;
                span { strong { (label) } br; span.muted { (hint) } }
            }
        }
    };
    let typed = match operator {
        OperatorField::Typed(remembered) => Some(
            prefill
                .and_then(|p| forms::value(p, "operator"))
                .or(remembered.as_deref())
                .unwrap_or(""),
        ),
        OperatorField::Fixed(_) => None,
    };
    html! {
        form.resolve method="post" action={ "/jobs/" (id) "/resolve" } data-job-id=(id) {
            input type="hidden" name=(csrf::FIELD) value=(csrf_token);
            input type="hidden" name="attempt" value=(job.attempt);
            fieldset {
                legend { "What happened at the provider?" }
                (choice("succeeded", "Refunded (succeeded)", "the provider shows the refund; give its reference"))
                (choice("failed", "Not refunded, and must not be (failed)", "definitely not done, and not to be done"))
                (choice("retry_reconcile", "Not sure: check again (retry, reconcile first)", "a worker asks the provider again, after the delay"))
                (choice("retry_execute", "Send again (resend)", "the provider may no longer de-duplicate it: tick the box below"))
            }
            div.row {
                label { "Provider reference" input type="text" name="provider_reference" value=(old("provider_reference")) placeholder="for succeeded, e.g. re_123" size="22"; }
                label { "Delay" input type="text" name="delay" value=(old("delay")) placeholder="retry, e.g. 10m" size="12"; }
                label.check { input type="checkbox" name="authorize_resend" checked[!old("authorize_resend").is_empty()]; " I accept the resend risk" }
            }
            div.row {
                @if let Some(name) = typed {
                    label { "Your name" input type="text" name="operator" value=(name) required autocomplete="username" size="16"; }
                } @else if let OperatorField::Fixed(name) = operator {
                    span.muted.as-operator { "Recorded as " strong { (name) } " (the console's credential)" }
                }
                label.grow { "Reason (recorded)" input type="text" name="reason" value=(old("reason")) required placeholder="e.g. refund re_123 seen in the provider dashboard"; }
            }
            button.primary type="submit" { "Resolve job " (id) " (attempt " (job.attempt) ")" }
        }
    }
}

/// Who resolved the job, from its history: for the message of the
/// operator who came second.
async fn first_resolver(console: &Console, job_id: u64) -> Option<String> {
    let detail = console.coordinator.job_detail(job_id).await.ok()?;
    let e = detail.events.iter().rev().find(|e| {
        matches!(
            e.event_kind(),
            Some(EventKind::ManualReviewResolved | EventKind::Cancelled)
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(e.detail.as_deref()?).ok()?;
    Some(format!(
        "{} ({}: {})",
        v.get("operator")?.as_str()?,
        v.get("action")?.as_str()?.replace('_', " "),
        v.get("reason")?.as_str()?
    ))
}

async fn refused(console: &Console, e: &CoordinatorError, mine: &str) -> (StatusCode, Notice) {
    match e {
        CoordinatorError::JobNotInManualReview {
            job_id,
            current,
            state,
            ..
        } => {
            let who = first_resolver(console, *job_id).await;
            let title = match &who {
                Some(who) => format!(
                    "Someone else resolved job {job_id} first: {who}. It is now {state} \
                     (attempt {current})."
                ),
                None => format!(
                    "Job {job_id} is no longer waiting for review: it is now {state} \
                     (attempt {current})."
                ),
            };
            (
                StatusCode::CONFLICT,
                Notice::new(Level::Warn, title).with_lines([format!(
                    "Your resolution ({mine}) was not applied; the refusal is recorded in the \
                     job's history. Check below that the job is where it should be."
                )]),
            )
        }
        CoordinatorError::AttemptSuperseded {
            job_id, current, ..
        } => (
            StatusCode::CONFLICT,
            Notice::new(
                Level::Warn,
                format!(
                    "Job {job_id} was resolved, ran again and was parked again (now attempt \
                     {current}) since you loaded it. Nothing was applied."
                ),
            )
            .with_lines(["Read the new evidence below, then resolve it again.".to_owned()]),
        ),
        CoordinatorError::AttemptNotIssued {
            presented, current, ..
        } => (
            StatusCode::CONFLICT,
            Notice::new(
                Level::Error,
                format!(
                    "The form presented attempt {presented}, but the job is at attempt \
                     {current}: reload the page and resolve from what it shows."
                ),
            ),
        ),
        CoordinatorError::CommitOutcomeUnknown(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Notice::new(
                Level::Error,
                "The database connection was lost while committing: your resolution may or \
                 may not be applied. Check the job's history below before doing anything else.",
            )
            .with_lines([why.clone()]),
        ),
        other => refusal(other),
    }
}

/// `POST /jobs/{id}/resolve`.
pub async fn post(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    Form(pairs): Form<Pairs>,
) -> Response {
    let id = match forms::job_id(&raw) {
        Ok(id) => id,
        Err(e) => return super::not_found_job(&e),
    };
    let who = match super::job_poster(&console, &headers, &pairs, "Not applied") {
        Ok(who) => who,
        Err((status, n)) => return job::show(&console, &headers, id, vec![n], status, None).await,
    };
    // Only a typed name is remembered for the next form.
    let remember = match who.source {
        operator::OperatorSource::Typed => operator::remember(&who.name),
        operator::OperatorSource::Credential => None,
    };
    let (request, authorize) = match forms::resolve_request(id, &who.name, &pairs) {
        Ok(r) => r,
        Err(bad) => {
            let n = bad_input(&bad);
            let mut r = job::show(
                &console,
                &headers,
                id,
                vec![n],
                StatusCode::BAD_REQUEST,
                Some(&pairs),
            )
            .await;
            if let Some(c) = remember {
                r.headers_mut().append(header::SET_COOKIE, c);
            }
            return r;
        }
    };
    let mine = request.resolution.as_str().replace('_', " ");
    let result = console
        .coordinator
        .resolve_manual_review(request, authorize)
        .await;
    let mut response = match result {
        Ok(out) => {
            let flag = if out.replayed { "replay" } else { "1" };
            Redirect::to(&format!("/jobs/{id}?resolved={flag}")).into_response()
        }
        Err(e) => {
            let (status, n) = match &e {
                CoordinatorError::InvalidArgument(v) => (StatusCode::BAD_REQUEST, bad_input(v)),
                other => refused(&console, other, &mine).await,
            };
            let prefill = (status == StatusCode::BAD_REQUEST).then_some(&pairs);
            job::show(&console, &headers, id, vec![n], status, prefill).await
        }
    };
    if let Some(c) = remember {
        response.headers_mut().append(header::SET_COOKIE, c);
    }
    response
}
