//! What a claim spends of its provider's budget (docs/design.md rule 11)
//! and what it says about it: the report, when a slot left short may look
//! again (a waiter at its turn among the provider's waiters), and the
//! statements, sent with the COMMIT, that spend the units, the shares per
//! key and write the waiters down.

use super::super::budget::LockedProvider;
use super::super::convert_sqlx_err;
use super::super::tx::Tx;
use super::super::waiters;
use super::decide::Decided;
use super::key_caps;
use super::ClaimRun;
use jobfence_domain::budget::{BudgetReport, Holdback};
use jobfence_domain::CoordinatorError;
use sqlx::MySqlConnection;
use std::time::Duration;

/// What a claim spends of its provider's budget and says about it.
#[derive(Default)]
pub(crate) struct BudgetSpend {
    /// What the claim did against the budget, when the queue has a provider.
    pub(crate) report: Option<BudgetReport>,
    /// When a slot left short may look again (asked for only).
    pub(crate) next_due: Option<Duration>,
    /// The statements that spend the units, sent with the COMMIT.
    pub(crate) after: Vec<String>,
}

impl ClaimRun<'_> {
    /// What the decisions spend of the budget (docs/design.md rule 11),
    /// the report of it, and, when asked for and a slot was left short,
    /// when to look again: when the held jobs' next unit is due, or else
    /// when the queue's next job becomes claimable.
    pub(super) async fn spend_budget(
        &self,
        tx: &mut Tx,
        decided: &[Decided<'_>],
    ) -> Result<BudgetSpend, CoordinatorError> {
        let handed = decided.iter().filter(|d| d.slot.is_some()).count();
        let short = (handed as u32) < self.wanted;
        let report = self.provider.map(|p| BudgetReport {
            provider: p.name.clone(),
            deferred: self.held.counts(),
            units_left: self.allowance.units.min(p.gcra().available()),
            in_flight: p.in_flight.map(|n| n + handed as u64),
        });
        let next_due = match (short && self.want_next_due, self.provider) {
            (false, _) => None,
            (true, Some(p)) if !self.held.is_empty() => self.turn_due(p),
            (true, _) => next_due(tx, self.queue).await?,
        };
        let budget_held = self.held.budget_total() > 0;
        let mut after = match self.provider {
            Some(p) => p.after_claim(self.queue, self.allowance.spent, budget_held)?,
            None => Vec::new(),
        };
        if let (Some(p), Some(k)) = (self.provider, &self.allowance.per_key) {
            after.extend(key_caps::spend(p, &k.spent())?);
        }
        if let Some(p) = self.provider {
            let mut handed = vec![0u32; self.slots.len()];
            for i in decided.iter().filter_map(|d| d.slot) {
                handed[i] += 1;
            }
            let for_units = self.held.count(Holdback::Rate) + self.held.count(Holdback::FairShare);
            after.extend(waiters::statements(
                p,
                self.queue,
                self.slots,
                &handed,
                for_units > 0,
            )?);
        }
        Ok(BudgetSpend {
            report,
            next_due,
            after,
        })
    }
}

impl ClaimRun<'_> {
    /// When a claim the budget held back looks again: when the held jobs'
    /// next unit is due, and for a slot of a waiter, no sooner than its
    /// turn among the provider's waiters (the earliest of its waiters').
    fn turn_due(&self, p: &LockedProvider) -> Option<Duration> {
        let due = self.held.due_in(p, self.allowance.spent)?;
        let cost = p.budget.max_cost();
        let turn = self
            .slots
            .iter()
            .filter_map(|s| s.waiter)
            .map(|t| p.turn_due_in(t.id, self.allowance.spent, cost))
            .min();
        Some(turn.map_or(due, |t| t.max(due)))
    }
}

/// How long until the next job of `queue` becomes claimable (see
/// `queries/jobs/next_due.sql`).
async fn next_due(
    conn: &mut MySqlConnection,
    queue: &str,
) -> Result<Option<Duration>, CoordinatorError> {
    /// Anything further than this is "nothing pending" (the SQL's sentinel
    /// is the year 9999).
    const NOTHING: i64 = 100 * 365 * 24 * 3600 * 1_000_000;
    let row = sqlx::query(include_str!("../queries/jobs/next_due.sql"))
        .bind(queue)
        .bind(queue)
        .fetch_one(conn)
        .await
        .map_err(convert_sqlx_err)?;
    let us: Option<i64> = super::super::rows::get(&row, "due_in_us")?;
    Ok(us
        .filter(|us| *us < NOTHING)
        .map(|us| Duration::from_micros(us.max(0) as u64)))
}
