//! One module per page: its handler (parse the request with
//! [`super::forms`], call the coordinator, map a refusal to a notice) and
//! its view. No GET changes anything; the posts ([`resolve::post`], and
//! the provider forms of [`providers`]) are behind [`super::csrf`].

pub mod bulk;
pub mod cancel;
pub mod events;
pub mod exception_act;
pub mod job;
pub mod jobs;
pub mod providers;
pub mod queues;
pub mod resolve;
pub mod review;
pub mod settlement;
pub mod workers;

use super::view::{self, Level, Nav, Notice};
use axum::http::StatusCode;
use axum::response::Response;
use jobfence_domain::CoordinatorError;
use jobfence_domain::FieldViolation;
use maud::html;

/// The notice and status for a coordinator error on a read.
pub fn refusal(e: &CoordinatorError) -> (StatusCode, Notice) {
    match e {
        CoordinatorError::InvalidArgument(v) => (StatusCode::BAD_REQUEST, bad_input(v)),
        CoordinatorError::JobNotFound { job_id } => (
            StatusCode::NOT_FOUND,
            Notice::new(Level::Error, format!("There is no job {job_id}.")),
        ),
        // docs/design.md rule 14: what the key record of a pruned job says.
        CoordinatorError::JobPruned(k) => (
            StatusCode::NOT_FOUND,
            Notice::new(
                Level::Warn,
                format!(
                    "Job {} finished and was pruned by retention; its key record remains.",
                    k.job_id
                ),
            )
            .with_lines([
                format!("queue {}, operation key {}", k.queue, k.operation_key),
                format!(
                    "final state {} at attempt {}, dispatched {} times",
                    k.final_state, k.attempt, k.dispatch_count
                ),
                format!(
                    "provider reference {}",
                    k.provider_reference.as_deref().unwrap_or("(none)")
                ),
                format!(
                    "created {} UTC, finished {} UTC, pruned {} UTC",
                    k.created_at.format("%Y-%m-%d %H:%M:%S"),
                    k.finished_at.format("%Y-%m-%d %H:%M:%S"),
                    k.pruned_at.format("%Y-%m-%d %H:%M:%S")
                ),
                "An Enqueue of this key answers this job (created=false); its observations and events were deleted with it.".to_owned(),
            ]),
        ),
        CoordinatorError::DatabaseUnavailable(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Notice::new(
                Level::Error,
                "The database is not answering; nothing was changed. Try again in a moment.",
            )
            .with_lines([why.clone()]),
        ),
        other => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Notice::new(Level::Error, "The coordinator could not answer.")
                .with_lines([other.to_string()]),
        ),
    }
}

/// One notice listing every bad field.
pub fn bad_input(v: &[FieldViolation]) -> Notice {
    Notice::new(Level::Error, "Some of what was entered cannot be used:").with_lines(
        v.iter()
            .map(|f| format!("{}: {}", f.field.replace('_', " "), f.description)),
    )
}

/// Any path the console does not serve.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    let n = Notice::new(Level::Error, format!("There is no page at {}.", uri.path()));
    let body = html! { p { a href="/queues" { "Go to the queues" } } };
    view::respond(
        StatusCode::NOT_FOUND,
        view::page("Not found", Nav::None, &[n], body),
        [],
    )
}

/// Who posts a job's form, once its CSRF token is checked: the console's
/// credential, or (without one) the name typed in the form. A refusal is
/// the status and notice to show on the job's page, its title starting
/// with `not_done` ("Not applied", "Not cancelled").
pub fn job_poster(
    console: &crate::Console,
    headers: &axum::http::HeaderMap,
    pairs: &crate::forms::Pairs,
    not_done: &str,
) -> Result<crate::operator::Operator, (StatusCode, Notice)> {
    use crate::{csrf, forms, operator};
    if let Err(why) = csrf::verify(headers, forms::value(pairs, csrf::FIELD).unwrap_or("")) {
        let n = Notice::new(Level::Error, format!("{not_done}: {why}."))
            .with_lines(["Reload this page and submit the form again.".to_owned()]);
        return Err((StatusCode::FORBIDDEN, n));
    }
    match console.identity.credential() {
        None => Ok(operator::Operator::from_form(
            forms::value(pairs, "operator").unwrap_or(""),
        )),
        Some(Ok(op)) => Ok(op),
        // The middleware checked the credential a moment ago; a reload in
        // between refuses here the same way.
        Some(Err(refusal)) => Err((
            StatusCode::FORBIDDEN,
            Notice::new(Level::Error, format!("{not_done}: {refusal}.")),
        )),
    }
}

/// The page for a job id that is not one.
pub fn not_found_job(why: &str) -> Response {
    let n = Notice::new(Level::Error, format!("No such job: {why}."));
    let body = html! { p { a href="/jobs" { "← all jobs" } } };
    view::respond(
        StatusCode::BAD_REQUEST,
        view::page("Job", Nav::Jobs, &[n], body),
        [],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use jobfence_domain::{JobState, KeyRecord};

    #[test]
    fn a_pruned_job_shows_what_its_key_record_says() {
        let t = chrono::NaiveDate::from_ymd_opt(2026, 11, 1)
            .unwrap()
            .and_hms_opt(12, 0, 0)
            .unwrap();
        let record = KeyRecord {
            job_id: 7,
            queue: "refunds".into(),
            operation_key: "refund-pay_1-100-TWD".into(),
            final_state: JobState::Succeeded,
            attempt: 2,
            dispatch_count: 1,
            provider_reference: Some("re_123".into()),
            created_at: t,
            finished_at: t,
            pruned_at: t,
        };
        let (status, notice) = refusal(&CoordinatorError::JobPruned(Box::new(record)));
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(notice.title.contains("Job 7 finished and was pruned"));
        let lines = notice.lines.join("\n");
        for want in [
            "refund-pay_1-100-TWD",
            "final state succeeded at attempt 2",
            "re_123",
        ] {
            assert!(lines.contains(want), "{want} not in {lines}");
        }
    }
}
