//! Settlement (docs/design.md rule 15): per provider, the periods its
//! imported reports cover, its lines by status, the refunds matched and the
//! manual reviews the reports resolved, and the exceptions not resolved,
//! each with a link to its job's story. A job's page shows its own lines
//! and exceptions ([`job_card`]).

use super::exception_act::{self, Acting};
use super::{refusal, view};
use crate::view::{job_link, when, Nav, Notice};
use crate::Console;
use jobfence_domain::settlement::records::{
    ExceptionList, ProviderSettlement, SettlementException, SettlementSettings,
};
use jobfence_domain::settlement::{ExceptionState, SettlementLine, Severity};

use crate::csrf;
use crate::forms::{self, Pairs};
use crate::view::Level;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{html, Markup};

fn severity_class(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "bad",
        Severity::Warning => "warn",
    }
}

/// The exceptions table; with `acting`, each row ends with its action
/// form (acknowledge, resolve).
pub fn exceptions_table(list: &[SettlementException], acting: Option<&Acting<'_>>) -> Markup {
    html! {
        @if list.is_empty() {
            p.empty { "No exceptions." }
        } @else {
            table.exceptions {
                thead { tr { th.num { "#" } th { "Kind" } th { "State" } th { "Operation" } th { "Job" } th { "What the report says" } th { "Opened" } @if acting.is_some() { th { "Act" } } } }
                tbody {
                    @for e in list {
                        tr class=(severity_class(e.severity)) data-exception-id=(e.id) {
                            td.num { (e.id) }
                            td { strong { (e.kind.as_str()) } div.small { (e.severity.as_str()) } }
                            td { (e.state.as_str()) }
                            td.key { (e.subject) }
                            td { @if let Some(id) = e.job_id { (job_link(id)) } @else { "—" } }
                            td { (e.detail) }
                            td { (when(e.opened_at)) }
                            @if let Some(acting) = acting { td { (exception_act::form(e, acting)) } }
                        }
                    }
                }
            }
        }
    }
}

/// The most exceptions a provider's card lists: the most one list
/// answers (`jobfence_core::settlement::MAX_EXCEPTIONS`).
pub const CARD_EXCEPTIONS: u32 = 500;

fn provider_card(
    settings: &SettlementSettings,
    report: &ProviderSettlement,
    open: &ExceptionList,
    acting: &Acting<'_>,
) -> Markup {
    let shown = open.exceptions.len() as u64;
    let preset = settings.preset.as_deref().unwrap_or("columns of its own");
    html! {
        section.card.settlement data-provider=(settings.provider) {
            div.card-head {
                h2 { (settings.provider) }
                span.muted { "report read as " (preset) " · lag " (humantime::format_duration(settings.lag)) }
            }
            div.columns {
                div {
                    h3 { "Periods covered" }
                    @if report.periods.is_empty() { p.empty { "Nothing imported yet." } }
                    ul {
                        @for p in &report.periods {
                            li { (when(p.start)) " → " (when(p.end)) span.muted { " imported " (when(p.last_imported_at)) " by " (p.last_imported_by) } }
                        }
                    }
                }
                div {
                    h3 { "Outcomes" }
                    ul.outcomes {
                        li { "matched " strong { (report.matched) } }
                        li { "manual reviews resolved " strong { (report.resolved_reviews) } }
                        @for (status, n) in &report.lines { li { (status) " lines " strong { (n) } } }
                    }
                    @if !report.amounts_not_compared.is_empty() {
                        p.small { "Amounts not compared for " (report.amounts_not_compared.join(", ")) " (no pointers)." }
                    }
                }
            }
            h3 { "Exceptions not resolved" }
            @if open.total > shown {
                p.notice.warn.cut {
                    "Showing the newest " (shown) " of " (open.total) "; narrow the list with "
                    code { "jobfence settlement exceptions --provider " (settings.provider) " --state … --job …" }
                    "."
                }
            }
            (exceptions_table(&open.exceptions, Some(acting)))
        }
    }
}

/// `GET /settlement` (`?acted=ID&state=S` after an action).
pub async fn page(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<Pairs>,
) -> Response {
    let mut notices = vec![];
    if let (Some(id), Some(state)) = (forms::value(&query, "acted"), forms::value(&query, "state"))
    {
        notices.push(Notice::new(
            Level::Ok,
            format!("Exception {id} is {state} now; your name and note are recorded."),
        ));
    }
    show(&console, &headers, notices, StatusCode::OK).await
}

/// The Settlement page with `notices` on top, answered with `status`
/// unless reading the reports fails.
pub async fn show(
    console: &Console,
    headers: &HeaderMap,
    mut notices: Vec<Notice>,
    mut status: StatusCode,
) -> Response {
    let (token, set_csrf) = csrf::ensure(headers);
    let operator = console.operator_field(headers);
    let acting = Acting {
        csrf_token: &token,
        operator: &operator,
    };
    let reports = match console.coordinator.settlement_reports(None).await {
        Ok(r) => r,
        Err(e) => {
            let (s, n) = refusal(&e);
            notices.push(n);
            status = s;
            vec![]
        }
    };
    let mut open = Vec::with_capacity(reports.len());
    for (settings, _) in &reports {
        let list = console
            .coordinator
            .settlement_exceptions(Some(&settings.provider), &[], None, CARD_EXCEPTIONS)
            .await
            .unwrap_or_default();
        open.push(list);
    }
    let body = html! {
        div.page-head {
            h1 { "Settlement" }
            span.muted { "the providers' own reports of the refunds they made" }
        }
        @if reports.is_empty() && status.is_success() {
            p.empty { "No provider has settlement settings: " code { "jobfence settlement configure" } "." }
        }
        @for ((settings, report), mine) in reports.iter().zip(&open) {
            (provider_card(settings, report, mine, &acting))
        }
    };
    view::respond(
        status,
        view::page("Settlement", Nav::Settlement, &notices, body),
        [set_csrf],
    )
}

/// A job's settlement, on its page: the report lines of its key and its
/// exceptions.
pub fn job_card(lines: &[(String, SettlementLine)], exceptions: &[SettlementException]) -> Markup {
    html! {
        section.card.job-settlement {
            h2 { "Settlement " span.muted.small { "what the provider's reports say of this operation" } }
            @if lines.is_empty() {
                p.empty { "No report line of this operation yet." }
            } @else {
                table {
                    thead { tr { th { "Provider" } th { "Refund" } th { "Status" } th.num { "Amount" } th { "Made" } } }
                    tbody {
                        @for (provider, l) in lines {
                            tr { td { (provider) } td.key { (l.provider_reference) } td { (l.status.as_str()) } td.num { (l.amount_minor) " " (l.currency) } td { (when(l.created_at)) } }
                        }
                    }
                }
            }
            @if !exceptions.is_empty() {
                h3 { "Exceptions" }
                (exceptions_table(exceptions, None))
                p.small.muted { "Acknowledge or resolve them on the " a href="/settlement" { "Settlement" } " page." }
                @for e in exceptions.iter().filter(|e| e.state == ExceptionState::Resolved) {
                    p.small.muted { "Exception " (e.id) " resolved." }
                }
            }
        }
    }
}
