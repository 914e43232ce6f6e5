//! The stored rules a round of fenced writes reads: the queue's stored
//! resend policy (docs/design.md rule 13) and its provider, for the Fails
//! that need them, and the hold a provider's Retry-After puts on its
//! hand-outs.

use super::Plan;
use crate::reads::LockedJob;
use crate::tx::Tx;
use jobfence_domain::write_plan::AppliedWrite;
use jobfence_domain::{
    transition, CoordinatorError, DbTime, FailDisposition, FencedWrite, QueuePolicies, QueuePolicy,
    ScopedWrite,
};
use std::collections::HashMap;
use std::time::Duration;

/// The stored rules of a round's queues: a resend is decided on the
/// queue's stored policy (docs/design.md rule 13), and a throttle report names
/// the queue's provider. Read in the round's transaction, only when a call
/// needs them.
pub(super) struct RoundRules {
    stored: HashMap<String, (Option<QueuePolicy>, Option<String>)>,
    /// The coordinator's policies with the stored ones over them, when any
    /// is stored.
    merged: Option<QueuePolicies>,
}

impl RoundRules {
    pub(super) async fn read(
        tx: &mut Tx,
        writes: &[ScopedWrite],
        round: &[usize],
        locked: &HashMap<u64, LockedJob>,
        policies: &QueuePolicies,
    ) -> Result<RoundRules, CoordinatorError> {
        let needs_rules: Vec<&str> = round
            .iter()
            .filter_map(|&i| match &writes[i].write {
                FencedWrite::Fail(f)
                    if f.disposition == FailDisposition::RetryExecute
                        || f.provider_retry_after.is_some() =>
                {
                    locked.get(&f.job_id).map(|l| l.job.queue.as_str())
                }
                _ => None,
            })
            .collect();
        let stored = queue_rules(tx, &needs_rules).await?;
        let merged = stored.values().any(|(p, _)| p.is_some()).then(|| {
            let mut merged = policies.clone();
            for (queue, (policy, _)) in &stored {
                if let Some(p) = policy {
                    merged.by_queue.insert(queue.clone(), *p);
                }
            }
            merged
        });
        Ok(RoundRules { stored, merged })
    }

    /// The policies the round decides resends on.
    pub(super) fn policies<'a>(&'a self, flags: &'a QueuePolicies) -> &'a QueuePolicies {
        self.merged.as_ref().unwrap_or(flags)
    }

    /// Applied Fails that report the provider's Retry-After hold its
    /// hand-outs until then, on every coordinator, committed with them:
    /// the statements to send with the COMMIT.
    pub(super) fn hold_throttled(
        &self,
        plans: &mut [Plan<'_>],
        locked: &HashMap<u64, LockedJob>,
        now: DbTime,
    ) -> Result<Vec<String>, CoordinatorError> {
        let mut throttles = Vec::new();
        for p in plans.iter_mut() {
            if let Plan::Apply {
                applied:
                    AppliedWrite {
                        after,
                        throttle: Some(retry_after),
                        ..
                    },
                throttled,
                ..
            } = p
            {
                let queue = locked[&after.id].job.queue.as_str();
                if let Some((_, Some(provider))) = self.stored.get(queue) {
                    throttles.push(throttle_statement(provider, *retry_after, now)?);
                    *throttled = Some(provider.clone());
                }
            }
        }
        Ok(throttles)
    }
}

/// The stored rules of `queues`, read in the write's transaction (a
/// plain read: they change only by an operator's call): each queue's
/// stored resend policy and its provider. Empty without a query when
/// `queues` is.
async fn queue_rules(
    conn: &mut sqlx::MySqlConnection,
    queues: &[&str],
) -> Result<
    std::collections::HashMap<String, (Option<QueuePolicy>, Option<String>)>,
    CoordinatorError,
> {
    let mut out = std::collections::HashMap::new();
    if queues.is_empty() {
        return Ok(out);
    }
    let sql = include_str!("../queries/queue_policies/write_rules.sql")
        .replace("{queues}", &crate::reads::placeholders(queues.len()));
    let mut q = sqlx::query(&sql);
    for queue in queues {
        q = q.bind(*queue);
    }
    for row in q.fetch_all(conn).await.map_err(crate::convert_sqlx_err)? {
        out.insert(
            crate::rows::text(&row, "queue")?,
            (
                crate::budget::stored_policy(&row)?,
                crate::rows::opt_text(&row, "provider")?,
            ),
        );
    }
    Ok(out)
}

/// The statement that holds `provider`'s hand-outs for `retry_after` from
/// `now` (never shortening a longer hold already stored), counting the
/// report.
fn throttle_statement(
    provider: &str,
    retry_after: Duration,
    now: DbTime,
) -> Result<String, CoordinatorError> {
    let until = crate::literal::time(transition::after(now, retry_after));
    Ok(include_str!("../queries/providers/throttle.sql")
        .replace("{until}", &until)
        .replace("{provider}", &crate::literal::provider(provider)?))
}
