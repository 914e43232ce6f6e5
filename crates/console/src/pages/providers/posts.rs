//! The posts of the page's forms: `POST /providers` (add a provider),
//! `/providers/{name}/pause`, `/resume` and `/budget`. Each checks the CSRF
//! token and who acts first ([`admit`]), calls the coordinator as
//! `JobAdmin` does, and answers with a redirect to the page saying what
//! was done, or the page again with the refusal and the form refilled.

use super::actions::{Prefill, Which};
use super::show;
use crate::forms::{self, query_string, Pairs};
use crate::operator;
use crate::pages::{bad_input, refusal};
use crate::view::{Level, Notice};
use crate::{csrf, Console};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use jobfence_domain::budget::Pause;
use jobfence_domain::providers::{ChangeBy, PutProvider, SetPause};
use jobfence_domain::CoordinatorError;
use jobfence_domain::FieldViolation;

/// The field violations of a provider call, named as on the form.
fn form_fields(v: &[FieldViolation]) -> Vec<FieldViolation> {
    v.iter()
        .map(|f| {
            let field = f.field.strip_prefix("budget.").unwrap_or(&f.field);
            FieldViolation::new(field, f.description.clone())
        })
        .collect()
}

/// What every post does first: check the CSRF token and find who acts.
/// `Err` is the page to answer with.
async fn admit(
    console: &Console,
    headers: &HeaderMap,
    pairs: &Pairs,
) -> Result<operator::Operator, Response> {
    if let Err(why) = csrf::verify(headers, forms::value(pairs, csrf::FIELD).unwrap_or("")) {
        let n = Notice::new(Level::Error, format!("Not applied: {why}."))
            .with_lines(["Reload this page and submit the form again.".to_owned()]);
        return Err(show(console, headers, vec![n], StatusCode::FORBIDDEN, None).await);
    }
    match console.identity.credential() {
        None => Ok(operator::Operator::from_form(
            forms::value(pairs, "operator").unwrap_or(""),
        )),
        Some(Ok(op)) => Ok(op),
        Some(Err(refusal)) => {
            let n = Notice::new(Level::Error, format!("Not applied: {refusal}."));
            Err(show(console, headers, vec![n], StatusCode::FORBIDDEN, None).await)
        }
    }
}

/// The answer to a post: back to the page on success (with what was
/// done), or the page with the refusal and the form filled in again.
async fn answer(
    console: &Console,
    headers: &HeaderMap,
    who: &operator::Operator,
    which: Which<'_>,
    pairs: &Pairs,
    result: Result<(&str, String), Vec<Notice>>,
    status_on_error: StatusCode,
) -> Response {
    let remember = match who.source {
        operator::OperatorSource::Typed => operator::remember(&who.name),
        operator::OperatorSource::Credential => None,
    };
    let mut response = match result {
        Ok((done, provider)) => Redirect::to(&format!(
            "/providers?{}#provider-{provider}",
            query_string(&[("done", done), ("provider", &provider)])
        ))
        .into_response(),
        Err(notices) => {
            let prefill = Prefill { which, pairs };
            show(console, headers, notices, status_on_error, Some(&prefill)).await
        }
    };
    if let Some(c) = remember {
        response.headers_mut().append(header::SET_COOKIE, c);
    }
    response
}

/// A coordinator refusal of a provider call as a notice and a status.
fn refused(e: &CoordinatorError) -> (StatusCode, Notice) {
    match e {
        CoordinatorError::InvalidArgument(v) => {
            (StatusCode::BAD_REQUEST, bad_input(&form_fields(v)))
        }
        CoordinatorError::CommitOutcomeUnknown(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Notice::new(
                Level::Error,
                "The database connection was lost while committing: the change may or may not \
                 be stored. Check the provider and the recent changes below before trying again.",
            )
            .with_lines([why.clone()]),
        ),
        other => refusal(other),
    }
}

/// Who changes the provider (the operator admitted) and why (the form's reason).
fn by(who: &operator::Operator, pairs: &Pairs) -> ChangeBy {
    ChangeBy {
        operator: who.name.clone(),
        reason: forms::value(pairs, "reason").unwrap_or("").to_owned(),
    }
}

/// `POST /providers/{name}/pause` (`pause` = `all` or `sends`, `reason`).
pub async fn pause(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(pairs): Form<Pairs>,
) -> Response {
    let who = match admit(&console, &headers, &pairs).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let which = Which::Pause(&name);
    let mode = match forms::pause(&pairs) {
        Ok(m) => m,
        Err(bad) => {
            let n = bad_input(&[bad]);
            return answer(
                &console,
                &headers,
                &who,
                which,
                &pairs,
                Err(vec![n]),
                StatusCode::BAD_REQUEST,
            )
            .await;
        }
    };
    let result = console
        .coordinator
        .set_provider_pause(SetPause {
            name: name.clone(),
            pause: mode,
            by: by(&who, &pairs),
        })
        .await;
    let (result, status) = match result {
        Ok(p) => {
            let done = if mode == Pause::Sends {
                "paused_sends"
            } else {
                "paused_all"
            };
            (Ok((done, p.name)), StatusCode::OK)
        }
        Err(e) => {
            let (s, n) = refused(&e);
            (Err(vec![n]), s)
        }
    };
    answer(&console, &headers, &who, which, &pairs, result, status).await
}

/// `POST /providers/{name}/resume` (`reason`).
pub async fn resume(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(pairs): Form<Pairs>,
) -> Response {
    let who = match admit(&console, &headers, &pairs).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let result = console
        .coordinator
        .set_provider_pause(SetPause {
            name: name.clone(),
            pause: Pause::None,
            by: by(&who, &pairs),
        })
        .await;
    let (result, status) = match result {
        Ok(p) => (Ok(("resumed", p.name)), StatusCode::OK),
        Err(e) => {
            let (s, n) = refused(&e);
            (Err(vec![n]), s)
        }
    };
    answer(
        &console,
        &headers,
        &who,
        Which::Resume(&name),
        &pairs,
        result,
        status,
    )
    .await
}

/// Stores a budget and queue list (a new provider's, or a replacement).
async fn put(
    console: &Console,
    headers: &HeaderMap,
    name: String,
    which: Which<'_>,
    pairs: &Pairs,
) -> Response {
    let who = match admit(console, headers, pairs).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let (budget, queues) = match forms::budget(pairs) {
        Ok(b) => b,
        Err(bad) => {
            let n = bad_input(&bad);
            return answer(
                console,
                headers,
                &who,
                which,
                pairs,
                Err(vec![n]),
                StatusCode::BAD_REQUEST,
            )
            .await;
        }
    };
    let result = console
        .coordinator
        .put_provider(PutProvider {
            name,
            budget,
            queues,
            by: by(&who, pairs),
        })
        .await;
    let (result, status) = match result {
        Ok((p, created)) => {
            let done = if created { "created" } else { "updated" };
            (Ok((done, p.name)), StatusCode::OK)
        }
        Err(e) => {
            let (s, n) = refused(&e);
            (Err(vec![n]), s)
        }
    };
    answer(console, headers, &who, which, pairs, result, status).await
}

/// `POST /providers/{name}/budget`: replaces the budget and the queues.
pub async fn budget(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(pairs): Form<Pairs>,
) -> Response {
    put(
        &console,
        &headers,
        name.clone(),
        Which::Budget(&name),
        &pairs,
    )
    .await
}

/// `POST /providers`: adds a provider (`name` and the budget fields). A
/// name that exists already is refused here: editing is the provider's
/// own form, which shows what it replaces.
pub async fn create(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(pairs): Form<Pairs>,
) -> Response {
    let name = forms::value(&pairs, "name").unwrap_or("").to_owned();
    if !name.is_empty() {
        if let Ok(all) = console.coordinator.list_providers().await {
            if all.iter().any(|p| p.name == name) {
                let who = match admit(&console, &headers, &pairs).await {
                    Ok(w) => w,
                    Err(r) => return r,
                };
                let n = Notice::new(
                    Level::Warn,
                    format!("A provider named {name} exists already; nothing was changed."),
                )
                .with_lines([format!(
                    "To change its budget, use the form under {name} above."
                )]);
                return answer(
                    &console,
                    &headers,
                    &who,
                    Which::New,
                    &pairs,
                    Err(vec![n]),
                    StatusCode::CONFLICT,
                )
                .await;
            }
        }
    }
    put(&console, &headers, name, Which::New, &pairs).await
}
