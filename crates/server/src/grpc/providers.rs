//! Proto conversions of the JobAdmin provider and queue-policy calls
//! (docs/design.md rules 11–13). The handlers themselves are in `job_admin.rs`,
//! with the other operator calls.

use super::convert::{self, duration};
use jobfence_api::v1 as proto;
use jobfence_domain::budget::{Budget, Pause};
use jobfence_domain::providers::{PolicyChange, ProviderRecord, QueuePolicyRecord};
use jobfence_domain::validate::Violations;
use jobfence_domain::QueuePolicy;

/// A budget from the request; unset costs are 1. A missing budget is a
/// violation (every other problem is the budget's own check).
pub fn budget(v: &mut Violations, b: Option<proto::ProviderBudget>) -> Budget {
    let Some(b) = b else {
        v.add("budget", "is required (rate_per_second and burst at least)");
        return Budget {
            rate_per_second: 1.0,
            burst: 1,
            max_in_flight: None,
            execute_cost: 1,
            reconcile_cost: 1,
            per_key: Default::default(),
        };
    };
    Budget {
        rate_per_second: b.rate_per_second,
        burst: b.burst,
        max_in_flight: b.max_in_flight,
        execute_cost: b.execute_cost.unwrap_or(1),
        reconcile_cost: b.reconcile_cost.unwrap_or(1),
        per_key: jobfence_domain::fairness::KeyCaps {
            share: b.key_share,
            max_in_flight: b.max_in_flight_per_key,
        },
    }
}

/// A pause mode from a PauseProvider request: ALL or SENDS.
pub fn pause(v: &mut Violations, raw: i32) -> Pause {
    match proto::ProviderPause::try_from(raw) {
        Ok(proto::ProviderPause::All) => Pause::All,
        Ok(proto::ProviderPause::Sends) => Pause::Sends,
        _ => {
            v.add(
                "pause",
                format!(
                    "must be PROVIDER_PAUSE_ALL or PROVIDER_PAUSE_SENDS (got {raw}); ResumeProvider ends a pause"
                ),
            );
            Pause::All
        }
    }
}

fn pause_to_proto(p: Pause) -> proto::ProviderPause {
    match p {
        Pause::None => proto::ProviderPause::None,
        Pause::All => proto::ProviderPause::All,
        Pause::Sends => proto::ProviderPause::Sends,
    }
}

/// A provider as the API shows it.
pub fn provider(p: ProviderRecord) -> proto::Provider {
    let throttled = p.throttled();
    proto::Provider {
        name: p.name,
        budget: Some(proto::ProviderBudget {
            rate_per_second: p.budget.rate_per_second,
            burst: p.budget.burst,
            max_in_flight: p.budget.max_in_flight,
            execute_cost: Some(p.budget.execute_cost),
            reconcile_cost: Some(p.budget.reconcile_cost),
            key_share: p.budget.per_key.share,
            max_in_flight_per_key: p.budget.per_key.max_in_flight,
        }),
        queues: p.queues,
        pause: pause_to_proto(p.pause) as i32,
        throttled_until: p
            .throttled_until
            .filter(|_| throttled)
            .map(convert::timestamp),
        units_available: p.units_available,
        next_unit_in: p.next_unit_in.map(convert::duration_to_proto),
        in_flight: p.in_flight,
        throttle_reports: p.throttle_reports,
        updated_at: Some(convert::timestamp(p.updated_at)),
        updated_by: p.updated_by,
        pause_reason: p.pause_reason.unwrap_or_default(),
    }
}

/// A stored resend policy from PutQueuePolicy: both fields are required.
pub fn queue_policy(v: &mut Violations, r: &proto::PutQueuePolicyRequest) -> QueuePolicy {
    let window = duration(v, "resend_window", r.resend_window);
    if r.resend_window.is_none() {
        v.add("resend_window", "is required (e.g. 24h for Stripe)");
    }
    if r.max_dispatches.is_none() {
        v.add("max_dispatches", "is required");
    }
    QueuePolicy {
        resend_window: window.unwrap_or_default(),
        max_dispatches: r.max_dispatches.unwrap_or(0),
    }
}

/// A queue's stored row as the API shows it.
pub fn queue_policy_to_proto(p: QueuePolicyRecord) -> proto::QueuePolicy {
    proto::QueuePolicy {
        queue: p.queue,
        resend_window: p
            .policy
            .map(|p| convert::duration_to_proto(p.resend_window)),
        max_dispatches: p.policy.map(|p| p.max_dispatches),
        job_retention: p.job_retention.map(convert::duration_to_proto),
        provider: p.provider.unwrap_or_default(),
        updated_at: Some(convert::timestamp(p.updated_at)),
        updated_by: p.updated_by,
    }
}

/// A recorded change as the API shows it.
pub fn change(c: PolicyChange) -> proto::PolicyChange {
    proto::PolicyChange {
        change_id: c.id,
        changed_at: Some(convert::timestamp(c.changed_at)),
        operator: c.operator,
        subject: c.subject,
        action: c.action,
        reason: c.reason,
        detail: c.detail,
    }
}
