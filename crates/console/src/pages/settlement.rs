//! Settlement (docs/design.md rule 15): per provider, the periods its
//! imported reports cover, its lines by status, the refunds matched and the
//! manual reviews the reports resolved, and the exceptions not resolved,
//! each with a link to its job's story. A job's page shows its own lines
//! and exceptions ([`job_card`]).

use super::{refusal, view};
use crate::view::{job_link, when, Nav, Notice};
use crate::Console;
use jobfence_domain::settlement::records::{
    ProviderSettlement, SettlementException, SettlementSettings,
};
use jobfence_domain::settlement::{ExceptionState, SettlementLine, Severity};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};

fn severity_class(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "bad",
        Severity::Warning => "warn",
    }
}

/// The exceptions table.
pub fn exceptions_table(list: &[SettlementException]) -> Markup {
    html! {
        @if list.is_empty() {
            p.empty { "No exceptions." }
        } @else {
            table.exceptions {
                thead { tr { th.num { "#" } th { "Kind" } th { "State" } th { "Operation" } th { "Job" } th { "What the report says" } th { "Opened" } } }
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
                        }
                    }
                }
            }
        }
    }
}

fn provider_card(
    settings: &SettlementSettings,
    report: &ProviderSettlement,
    open: &[SettlementException],
) -> Markup {
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
            (exceptions_table(open))
        }
    }
}

/// `GET /settlement`.
pub async fn page(State(console): State<Console>) -> Response {
    let mut notices: Vec<Notice> = vec![];
    let mut status = StatusCode::OK;
    let reports = match console.coordinator.settlement_reports(None).await {
        Ok(r) => r,
        Err(e) => {
            let (s, n) = refusal(&e);
            notices.push(n);
            status = s;
            vec![]
        }
    };
    let open = console
        .coordinator
        .settlement_exceptions(None, &[], None, 500)
        .await
        .unwrap_or_default();
    let body = html! {
        div.page-head {
            h1 { "Settlement" }
            span.muted { "the providers' own reports of the refunds they made" }
        }
        @if reports.is_empty() && status.is_success() {
            p.empty { "No provider has settlement settings: " code { "jobfence settlement configure" } "." }
        }
        @for (settings, report) in &reports {
            @let mine: Vec<SettlementException> = open.iter().filter(|e| e.provider == settings.provider).cloned().collect();
            (provider_card(settings, report, &mine))
        }
    };
    view::respond(
        status,
        view::page("Settlement", Nav::Settlement, &notices, body),
        [],
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
                (exceptions_table(exceptions))
                @for e in exceptions.iter().filter(|e| e.state == ExceptionState::Resolved) {
                    p.small.muted { "Exception " (e.id) " resolved." }
                }
            }
        }
    }
}
