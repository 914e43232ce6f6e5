//! Cancel one job from its page: a ready job never dispatched (CancelJob,
//! fenced on the attempt the operator saw, like `jobfence jobs cancel`).
//! A job that was claimed or sent meanwhile is refused
//! (JOB_NOT_CANCELLABLE, ATTEMPT_SUPERSEDED) and the page says what it is
//! now. Many jobs at once: `jobfence jobs bulk cancel`.

use super::{bad_input, job};
use crate::forms::{self, Pairs};
use crate::operator::OperatorField;
use crate::view::{Level, Notice};
use crate::{csrf, Console};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Form;
use jobfence_domain::admin::CancelJob;
use jobfence_domain::{CoordinatorError, Job, JobState};
use maud::{html, Markup};

/// Whether `job` can be cancelled: ready, and never sent.
pub fn cancellable(job: &Job) -> bool {
    job.state == JobState::Ready && job.dispatch_count == 0
}

/// The cancel form for `job`.
pub fn form(job: &Job, csrf_token: &str, operator: &OperatorField) -> Markup {
    html! {
        form.cancel method="post" action={ "/jobs/" (job.id) "/cancel" } data-job-id=(job.id) {
            input type="hidden" name=(csrf::FIELD) value=(csrf_token);
            input type="hidden" name="attempt" value=(job.attempt);
            p.muted { "Never sent to the provider: it can still be cancelled. It will not be sent." }
            div.row {
                @match operator {
                    OperatorField::Typed(remembered) => {
                        label { "Your name" input type="text" name="operator" value=(remembered.as_deref().unwrap_or("")) required autocomplete="username" size="16"; }
                    }
                    OperatorField::Fixed(name) => {
                        span.muted.as-operator { "Recorded as " strong { (name) } " (the console's credential)" }
                    }
                }
                label.grow { "Reason (recorded)" input type="text" name="reason" required placeholder="e.g. duplicate request"; }
            }
            button.danger type="submit" { "Cancel job " (job.id) }
        }
    }
}

/// `POST /jobs/{id}/cancel`.
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
    let refuse = |status, n: Notice| {
        let console = console.clone();
        let headers = headers.clone();
        async move { job::show(&console, &headers, id, vec![n], status, None).await }
    };
    let who = match super::job_poster(&console, &headers, &pairs, "Not cancelled") {
        Ok(who) => who,
        Err((status, n)) => return refuse(status, n).await,
    };
    let attempt = forms::value(&pairs, "attempt")
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let call = CancelJob {
        job_id: id,
        attempt,
        operator: who.name.clone(),
        reason: forms::value(&pairs, "reason").unwrap_or("").to_owned(),
    };
    match console.coordinator.cancel_job(call).await {
        Ok(_) => who.redirect_after_post(&format!("/jobs/{id}?cancelled=1")),
        Err(CoordinatorError::InvalidArgument(v)) => {
            refuse(StatusCode::BAD_REQUEST, bad_input(&v)).await
        }
        Err(e) => {
            let n = Notice::new(Level::Error, format!("Not cancelled: {e}."))
                .with_lines(["The job's page below shows what it is now.".to_owned()]);
            refuse(StatusCode::CONFLICT, n).await
        }
    }
}
