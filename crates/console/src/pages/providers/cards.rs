//! What the page shows: a card per provider (its budget and what is left
//! of it now, jobs in flight, pause and throttle, with its forms), the
//! stored queue policies, and the recent changes with who made them.

use super::actions::{budget_form, pause_form, resume_form, Prefill};
use crate::forms::query_string;
use crate::operator::OperatorField;
use crate::view::{age, ago, when};
use jobfence_domain::budget::Pause;
use jobfence_domain::providers::{PolicyChange, ProviderRecord, QueuePolicyRecord};
use maud::{html, Markup};

/// Units per second as written (`80`, `0.5`).
pub(super) fn rate(r: f64) -> String {
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

/// One figure of a card, marked when it needs a look.
fn tile(label: &str, value: Markup, warn: bool) -> Markup {
    html! {
        div class={ "tile" @if warn { " warn" } } {
            div.label { (label) }
            div.value { (value) }
        }
    }
}

/// One provider's card: its state at a glance, its tiles, its forms.
pub(super) fn card(
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

/// The stored queue policies, and which queues follow the flags.
pub(super) fn queue_policies(all: &[QueuePolicyRecord]) -> Markup {
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

/// The recent changes, newest first, with who made them and why.
pub(super) fn changes(all: &[PolicyChange]) -> Markup {
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
