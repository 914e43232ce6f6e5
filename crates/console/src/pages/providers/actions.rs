//! The forms of a provider's card, each posting with a recorded reason:
//! pause (everything, or sends only), resume, and the budget (an existing
//! provider's, or a new one's). After a refused post its form comes back
//! filled in with what was typed.

use super::cards::rate;
use crate::csrf;
use crate::forms::{self, Pairs};
use crate::operator::OperatorField;
use jobfence_domain::budget::Pause;
use jobfence_domain::providers::ProviderRecord;
use maud::{html, Markup};

/// Which form a refused post came from, to show it again filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which<'a> {
    Pause(&'a str),
    Resume(&'a str),
    Budget(&'a str),
    New,
}

/// A refused post: its form and what was typed into it.
pub(super) struct Prefill<'a> {
    pub(super) which: Which<'a>,
    pub(super) pairs: &'a Pairs,
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

/// The pause form: sends only or everything, with a reason.
pub(super) fn pause_form(
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

/// The resume form: ends a pause and a reported throttle, with a reason.
pub(super) fn resume_form(
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
pub(super) fn budget_form(
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
