//! A person's action on a settlement exception from the Settlement page
//! (docs/design.md rule 15), as `jobfence settlement exceptions ack|resolve`
//! does it: acknowledge an open one (someone is on it), resolve an open or
//! acknowledged one, each with the operator's name and a note, recorded.
//! The form carries the state the operator saw; an exception someone
//! moved meanwhile is refused (SETTLEMENT_EXCEPTION_MOVED) and the page
//! says what it is now. Nothing here decides a job: an exception's life
//! is the operators' record, the job stays as the fence left it.

use super::{bad_input, settlement};
use crate::forms::{self, Pairs};
use crate::operator::OperatorField;
use crate::view::{Level, Notice};
use crate::{csrf, Console};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Form;
use jobfence_domain::settlement::records::{ActOnException, SettlementException};
use jobfence_domain::settlement::ExceptionState;
use jobfence_domain::{CoordinatorError, FieldViolation};
use maud::{html, Markup};

/// What the Settlement page needs to draw a form on each exception.
pub struct Acting<'a> {
    pub csrf_token: &'a str,
    pub operator: &'a OperatorField,
}

/// The action form of `e`: acknowledge (when open) and resolve, sharing
/// one note; nothing for a resolved exception.
pub fn form(e: &SettlementException, acting: &Acting<'_>) -> Markup {
    if e.state == ExceptionState::Resolved {
        return html! { span.muted { "resolved" } };
    }
    html! {
        form.exception-act method="post" action={ "/settlement/exceptions/" (e.id) } data-exception-id=(e.id) {
            input type="hidden" name=(csrf::FIELD) value=(acting.csrf_token);
            input type="hidden" name="seen_state" value=(e.state.as_str());
            @match acting.operator {
                OperatorField::Typed(remembered) => {
                    input type="text" name="operator" value=(remembered.as_deref().unwrap_or("")) required autocomplete="username" size="10" placeholder="your name";
                }
                OperatorField::Fixed(name) => {
                    span.muted.as-operator { "as " strong { (name) } }
                }
            }
            input type="text" name="note" required placeholder="what was done (recorded)" size="22";
            @if e.state == ExceptionState::Open {
                button type="submit" name="to_state" value="acknowledged" { "Acknowledge" }
            }
            button type="submit" name="to_state" value="resolved" { "Resolve" }
        }
    }
}

/// The action a post asks for, its fields checked; the operator's name is
/// added by the caller.
fn action(id: u64, pairs: &Pairs) -> Result<ActOnException, Vec<FieldViolation>> {
    let mut bad = Vec::new();
    let mut state = |field: &str| match forms::value(pairs, field)
        .unwrap_or("")
        .parse::<ExceptionState>()
    {
        Ok(s) => Some(s),
        Err(e) => {
            bad.push(FieldViolation::new(field, e.to_string()));
            None
        }
    };
    let (seen, to) = (state("seen_state"), state("to_state"));
    match (seen, to) {
        (Some(seen), Some(to)) => Ok(ActOnException {
            id,
            seen,
            to,
            operator: String::new(),
            note: forms::value(pairs, "note").unwrap_or("").to_owned(),
        }),
        _ => Err(bad),
    }
}

/// The notice and status of a refused action.
fn refused(e: &CoordinatorError) -> (StatusCode, Notice) {
    match e {
        CoordinatorError::InvalidArgument(v) => (StatusCode::BAD_REQUEST, bad_input(v)),
        CoordinatorError::SettlementExceptionNotFound { .. } => (
            StatusCode::NOT_FOUND,
            Notice::new(Level::Error, format!("Not applied: {e}.")),
        ),
        CoordinatorError::SettlementExceptionMoved { .. } => (
            StatusCode::CONFLICT,
            Notice::new(Level::Warn, format!("Not applied: {e}."))
                .with_lines(["The table below shows it as it is now.".to_owned()]),
        ),
        _ => super::refusal(e),
    }
}

/// `POST /settlement/exceptions/{id}`.
pub async fn post(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    Form(pairs): Form<Pairs>,
) -> Response {
    let again = |status, n: Notice| {
        let console = console.clone();
        let headers = headers.clone();
        async move { settlement::show(&console, &headers, vec![n], status).await }
    };
    let Ok(id) = raw.parse::<u64>() else {
        let n = Notice::new(Level::Error, format!("There is no exception {raw:?}."));
        return again(StatusCode::NOT_FOUND, n).await;
    };
    let who = match super::job_poster(&console, &headers, &pairs, "Not applied") {
        Ok(who) => who,
        Err((status, n)) => return again(status, n).await,
    };
    let mut act = match action(id, &pairs) {
        Ok(a) => a,
        Err(v) => return again(StatusCode::BAD_REQUEST, bad_input(&v)).await,
    };
    act.operator = who.name.clone();
    match console.coordinator.act_on_settlement_exception(act).await {
        Ok(done) => {
            let to = format!(
                "/settlement?acted={}&state={}",
                done.id,
                done.state.as_str()
            );
            who.redirect_after_post(&to)
        }
        Err(e) => {
            let (status, n) = refused(&e);
            again(status, n).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forms::pairs_of as pairs;

    #[test]
    fn a_post_names_its_states_or_is_refused_field_by_field() {
        let ok = action(
            7,
            &pairs(&[
                ("seen_state", "open"),
                ("to_state", "resolved"),
                ("note", "asked the PSP"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (ok.id, ok.seen, ok.to),
            (7, ExceptionState::Open, ExceptionState::Resolved)
        );
        assert_eq!(ok.note, "asked the PSP");
        let bad = action(7, &pairs(&[("seen_state", "opened")])).unwrap_err();
        let fields: Vec<&str> = bad.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["seen_state", "to_state"], "{bad:?}");
    }
}
