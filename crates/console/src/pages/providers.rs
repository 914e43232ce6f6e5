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

use super::{bad_input, refusal, view};
use crate::forms::{self, query_string, Pairs};
use crate::operator::{self, OperatorField};
use crate::view::{age, ago, when, Level, Nav, Notice};
use crate::{csrf, Console};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use jobfence_domain::budget::Pause;
use jobfence_domain::providers::{
    ChangeBy, PolicyChange, ProviderRecord, PutProvider, QueuePolicyRecord, SetPause,
};
use jobfence_domain::CoordinatorError;
use jobfence_domain::FieldViolation;
use maud::{html, Markup};

/// Changes shown at the bottom of the page.
const RECENT_CHANGES: u32 = 20;

/// Which form a refused post came from, to show it again filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which<'a> {
    Pause(&'a str),
    Resume(&'a str),
    Budget(&'a str),
    New,
}

/// A refused post: its form and what was typed into it.
struct Prefill<'a> {
    which: Which<'a>,
    pairs: &'a Pairs,
}

impl Prefill<'_> {
    fn get<'p>(prefill: Option<&'p Prefill<'_>>, which: Which<'_>, key: &str) -> Option<&'p str> {
        prefill
            .filter(|p| p.which == which)
            .and_then(|p| forms::value(p.pairs, key))
    }
}

/// The operator part of a form: a name field when names are typed, the
/// credential's name otherwise.
fn operator_field(name: &OperatorField, typed: Option<&str>) -> Markup {
    match name {
        OperatorField::Typed(remembered) => {
            let value = typed.or(remembered.as_deref()).unwrap_or("");
            html! { label { "Your name" input type="text" name="operator" value=(value) required autocomplete="username" size="14"; } }
        }
        OperatorField::Fixed(n) => {
            html! { span.muted.as-operator { "Recorded as " strong { (n) } } }
        }
    }
}

/// Units per second as written (`80`, `0.5`).
fn rate(r: f64) -> String {
    format!("{r}")
}

/// A resend window as an operator writes it: `24h`, `90m`, `45s`.
fn window(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if d.subsec_nanos() != 0 || s == 0 {
        humantime::format_duration(d).to_string()
    } else if s % 3600 == 0 {
        format!("{}h", s / 3600)
    } else if s % 60 == 0 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// "when the next unit is due", to the millisecond under a second.
fn next_unit(d: std::time::Duration) -> String {
    if d < std::time::Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        age(d)
    }
}

/// The badge that says at a glance whether the provider's jobs go out.
fn status_badge(p: &ProviderRecord) -> Markup {
    match p.pause {
        Pause::All => html! { span.badge.paused-all { "PAUSED: nothing is handed out" } },
        Pause::Sends => {
            html! { span.badge.paused-sends { "PAUSED: sends held, reconciles go on" } }
        }
        Pause::None if p.throttled() => {
            html! { span.badge.throttled { "THROTTLED: a worker reported the provider's 429" } }
        }
        Pause::None => html! { span.badge.running { "handing out within the budget" } },
    }
}

fn tile(label: &str, value: Markup, warn: bool) -> Markup {
    html! {
        div class={ "tile" @if warn { " warn" } } {
            div.label { (label) }
            div.value { (value) }
        }
    }
}

fn pause_form(
    p: &ProviderRecord,
    token: &str,
    name: &OperatorField,
    prefill: Option<&Prefill>,
) -> Markup {
    let which = Which::Pause(&p.name);
    let old = |k: &str| Prefill::get(prefill, which, k);
    let chosen = old("pause").unwrap_or(match p.pause {
        Pause::All => "all",
        _ => "sends",
    });
    let title = if p.pause == Pause::None {
        "Pause"
    } else {
        "Change the pause"
    };
    html! {
        form.provider-action.pause method="post" action={ "/providers/" (p.name) "/pause" } data-provider=(p.name) {
            input type="hidden" name=(csrf::FIELD) value=(token);
            h3 { (title) }
            div.row {
                label.check { input type="radio" name="pause" value="sends" checked[chosen == "sends"] required; " Sends only " span.muted { "(reconciles and takeovers go on)" } }
                label.check { input type="radio" name="pause" value="all" checked[chosen == "all"] required; " Everything" }
            }
            div.row {
                (operator_field(name, old("operator")))
                label.grow { "Reason (recorded)" input type="text" name="reason" value=(old("reason").unwrap_or("")) required placeholder="e.g. INC-42: the provider answers 5xx"; }
            }
            button.danger type="submit" { "Pause " (p.name) }
        }
    }
}

fn resume_form(
    p: &ProviderRecord,
    token: &str,
    name: &OperatorField,
    prefill: Option<&Prefill>,
) -> Markup {
    let which = Which::Resume(&p.name);
    let old = |k: &str| Prefill::get(prefill, which, k);
    html! {
        form.provider-action.resume method="post" action={ "/providers/" (p.name) "/resume" } data-provider=(p.name) {
            input type="hidden" name=(csrf::FIELD) value=(token);
            h3 { "Resume" }
            p.muted.small { "Ends the pause and any throttle a worker reported." }
            div.row {
                (operator_field(name, old("operator")))
                label.grow { "Reason (recorded)" input type="text" name="reason" value=(old("reason").unwrap_or("")) required placeholder="e.g. INC-42 resolved by the provider"; }
            }
            button.primary type="submit" { "Resume " (p.name) }
        }
    }
}

/// The budget form: an existing provider's (prefilled with its budget) or
/// a new one's (with a name field).
fn budget_form(
    p: Option<&ProviderRecord>,
    token: &str,
    name: &OperatorField,
    prefill: Option<&Prefill>,
) -> Markup {
    let which = p.map_or(Which::New, |p| Which::Budget(&p.name));
    let refused = prefill.is_some_and(|f| f.which == which);
    let stored = |k: &str| -> String {
        let Some(p) = p else { return String::new() };
        let b = &p.budget;
        match k {
            "rate_per_second" => rate(b.rate_per_second),
            "burst" => b.burst.to_string(),
            "max_in_flight" => b.max_in_flight.map(|n| n.to_string()).unwrap_or_default(),
            "execute_cost" => b.execute_cost.to_string(),
            "reconcile_cost" => b.reconcile_cost.to_string(),
            "queues" => p.queues.join(", "),
            _ => String::new(),
        }
    };
    // After a refused post, what was typed (blank included); else the stored value.
    let v = |k: &str| -> String {
        if refused {
            Prefill::get(prefill, which, k).unwrap_or("").to_owned()
        } else {
            stored(k)
        }
    };
    let action = match p {
        Some(p) => format!("/providers/{}/budget", p.name),
        None => "/providers".to_owned(),
    };
    let summary = match p {
        Some(p) => format!("Edit the budget of {}", p.name),
        None => "Add a provider".to_owned(),
    };
    html! {
        details.budget open[refused] {
            summary { (summary) }
            form.provider-action.budget method="post" action=(action) data-provider=[p.map(|p| p.name.as_str())] {
                input type="hidden" name=(csrf::FIELD) value=(token);
                div.row {
                    @if p.is_none() {
                        label { "Name" input type="text" name="name" value=(v("name")) required placeholder="e.g. stripe" size="14"; }
                    }
                    label { "Rate (units/s)" input type="text" name="rate_per_second" value=(v("rate_per_second")) required placeholder="e.g. 80" size="8"; }
                    label { "Burst (units)" input type="text" name="burst" value=(v("burst")) required placeholder="e.g. 100" size="8"; }
                    label { "Max in flight" input type="text" name="max_in_flight" value=(v("max_in_flight")) placeholder="no cap" size="8"; }
                    label { "Send costs" input type="text" name="execute_cost" value=(v("execute_cost")) placeholder="1" size="4"; }
                    label { "Reconcile costs" input type="text" name="reconcile_cost" value=(v("reconcile_cost")) placeholder="1" size="4"; }
                }
                div.row {
                    label.grow { "Queues (replaces the list)" input type="text" name="queues" value=(v("queues")) placeholder="e.g. refunds, payouts"; }
                }
                div.row {
                    (operator_field(name, Prefill::get(prefill, which, "operator")))
                    label.grow { "Reason (recorded)" input type="text" name="reason" value=(if refused { v("reason") } else { String::new() }) required placeholder="e.g. Stripe live 100 req/s, keep 20 % for the dashboard"; }
                }
                button.primary type="submit" { @if p.is_some() { "Store the budget" } @else { "Add the provider" } }
            }
        }
    }
}

fn card(
    p: &ProviderRecord,
    token: &str,
    name: &OperatorField,
    prefill: Option<&Prefill>,
) -> Markup {
    let b = &p.budget;
    let paused = p.pause != Pause::None;
    let class = match p.pause {
        Pause::All => "card provider paused paused-all",
        Pause::Sends => "card provider paused paused-sends",
        Pause::None if p.throttled() => "card provider throttled",
        Pause::None => "card provider",
    };
    html! {
        section class=(class) id={ "provider-" (p.name) } data-provider=(p.name) data-pause=(p.pause.as_str()) {
            div.card-head {
                h2 { (p.name) }
                (status_badge(p))
                span.muted {
                    @if p.queues.is_empty() { "no queues" } @else {
                        "queues "
                        @for (i, q) in p.queues.iter().enumerate() {
                            @if i > 0 { ", " }
                            a href={ "/jobs?" (query_string(&[("queue", q)])) } { (q) }
                        }
                    }
                }
            }
            @if paused {
                p.reason {
                    "Why paused: " strong { (p.pause_reason.as_deref().unwrap_or("(no reason stored)")) }
                }
            }
            div.tiles {
                (tile("Budget", html! { (rate(b.rate_per_second)) "/s · burst " (b.burst) }, false))
                (tile("Cost of a send / a reconcile", html! { (b.execute_cost) " / " (b.reconcile_cost) " " span.small.muted { "units" } }, false))
                (tile("Units available now", html! {
                    (p.units_available) " " span.small.muted { "of " (b.burst) }
                    @if let Some(d) = p.next_unit_in { div.small.muted { "next in " (next_unit(d)) } }
                }, p.units_available == 0))
                (tile("In flight", html! {
                    (p.in_flight)
                    " " span.small.muted { @match b.max_in_flight { Some(m) => { "of " (m) }, None => "no cap" } }
                }, b.max_in_flight.is_some_and(|m| p.in_flight >= u64::from(m))))
                (tile("Throttled until", html! {
                    @match p.throttled_until.filter(|_| p.throttled()) {
                        Some(t) => (when(t)),
                        None => span.muted { "not throttled" },
                    }
                    div.small.muted { "429s reported in all: " (p.throttle_reports) }
                }, p.throttled()))
                (tile("Last change", html! {
                    (p.updated_by) div.small.muted { (ago(p.updated_at)) " ago" }
                }, false))
            }
            div.columns.actions {
                (pause_form(p, token, name, prefill))
                @if paused || p.throttled() {
                    (resume_form(p, token, name, prefill))
                } @else {
                    div.muted.small.not-paused { "Not paused: hand-outs go on within the budget." }
                }
            }
            (budget_form(Some(p), token, name, prefill))
        }
    }
}

fn queue_policies(all: &[QueuePolicyRecord]) -> Markup {
    html! {
        @if all.is_empty() {
            p.muted { "No queue has a stored policy or a provider: every coordinator's --resend-window and --max-dispatches apply." }
        } @else {
            table.policies {
                thead { tr { th { "Queue" } th { "Provider" } th { "Resend window" } th.num { "Max dispatches" } th { "Changed" } th { "By" } } }
                tbody {
                    @for q in all {
                        tr data-queue=(q.queue) {
                            td { a href={ "/jobs?" (query_string(&[("queue", &q.queue)])) } { (q.queue) } }
                            td { (q.provider.as_deref().unwrap_or("")) }
                            @match q.policy {
                                Some(pol) => {
                                    td { (window(pol.resend_window)) }
                                    td.num { (pol.max_dispatches) }
                                }
                                None => {
                                    td.muted colspan="2" { "the coordinators' flags" }
                                }
                            }
                            td { (when(q.updated_at)) }
                            td { (q.updated_by) }
                        }
                    }
                }
            }
            p.muted.small { "A stored policy wins over every coordinator's --resend-window / --max-dispatches; set it with " code { "jobfence queue-policies set" } "." }
        }
    }
}

fn changes(all: &[PolicyChange]) -> Markup {
    html! {
        @if all.is_empty() {
            p.muted { "No changes recorded yet." }
        } @else {
            table.changes {
                thead { tr { th { "When" } th { "Operator" } th { "Subject" } th { "Action" } th { "Reason" } th { "Stored values" } } }
                tbody {
                    @for c in all {
                        tr data-change=(c.id) data-action=(c.action) {
                            td { (when(c.changed_at)) }
                            td { strong { (c.operator) } }
                            td { (c.subject) }
                            td { (c.action.replace('_', " ")) }
                            td { (c.reason) }
                            td { details { summary.small { "values" } pre.inline { (c.detail) } } }
                        }
                    }
                }
            }
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn windows_and_next_units_read_as_written() {
        assert_eq!(window(Duration::from_secs(86_400)), "24h");
        assert_eq!(window(Duration::from_secs(5_400)), "90m");
        assert_eq!(window(Duration::from_secs(45)), "45s");
        assert_eq!(next_unit(Duration::from_millis(250)), "250 ms");
        assert_eq!(next_unit(Duration::from_secs(90)), "1m 30s");
    }
}
