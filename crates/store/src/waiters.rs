//! Waiters take turns at a provider's budget (docs/design.md rule 11,
//! "Waiters take turns") inside a claim transaction: the provider's live
//! waiters read under its row lock, and the statements, sent with the
//! COMMIT, that write a held-back long-polling Claim down as a waiter,
//! refresh it, or take it off once it no longer waits for the budget. The
//! turns themselves are decided in `jobfence_domain::budget::waiters`.
//!
//! Every read and write of `budget_waiters` happens under the provider's
//! row lock, which every claim of the provider takes first: they cannot
//! conflict with each other, only wait for that lock as the claim does.

use super::budget::LockedProvider;
use super::literal;
use super::{batch, rows};
use jobfence_domain::budget::waiters::{ahead_of, WaiterTicket, MAX_WAITERS_READ};
use jobfence_domain::{ClaimSlot, CoordinatorError, DbTime};
use sqlx::MySqlConnection;
use std::time::Duration;

/// A live waiter of a provider, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiveWaiter {
    pub id: u64,
    pub expires_at: DbTime,
}

impl LockedProvider {
    /// Reads the provider's live waiters in turn order, one round trip,
    /// when a registration may still be live (`waiters_until` after the
    /// lock's clock); otherwise reads nothing.
    pub(crate) async fn load_waiters(
        &mut self,
        conn: &mut MySqlConnection,
    ) -> Result<(), CoordinatorError> {
        if self.waiters_until.is_none_or(|t| t <= self.now) {
            return Ok(());
        }
        let sql = include_str!("queries/waiters/live.sql")
            .replace("{provider}", &literal::provider(&self.name)?)
            .replace("{limit}", &MAX_WAITERS_READ.to_string());
        let sets = batch::result_sets(conn, &sql).await?;
        self.waiters = sets
            .first()
            .into_iter()
            .flatten()
            .map(|row| {
                Ok(LiveWaiter {
                    id: rows::get(row, "waiter")?,
                    expires_at: rows::time(row, "expires_at")?,
                })
            })
            .collect::<Result<_, CoordinatorError>>()?;
        Ok(())
    }

    /// The live waiters' ids, in turn order.
    pub(crate) fn waiter_ids(&self) -> Vec<u64> {
        self.waiters.iter().map(|w| w.id).collect()
    }

    /// How long until the turn of the waiter `ticket` of a claim that spent
    /// `spent` units: until `ahead + 1` jobs' worth of `cost` units are
    /// there, `ahead` being the live waiters before it.
    pub(crate) fn turn_due_in(&self, ticket: u64, spent: u32, cost: u32) -> Duration {
        let ahead = ahead_of(&self.waiter_ids(), ticket) as u32;
        let after = jobfence_domain::budget::Gcra::at(
            &self.budget,
            self.gcra().spend(self.now, spent),
            self.now,
        );
        after.due_in(cost.max(1).saturating_mul(ahead + 1))
    }
}

/// What the claim of `queue` writes of its waiters, with its COMMIT: the
/// slots it left short that carry a ticket are written down (or refreshed)
/// when the budget held jobs back (`held_for_units`); every other
/// registered ticket of its slots is taken off (every other ticket when
/// the read of the waiters was cut at [`MAX_WAITERS_READ`], since one past
/// it is not seen), with the lapsed waiters of the provider. `handed[i]`:
/// the jobs slot `i` got.
pub(crate) fn statements(
    p: &LockedProvider,
    queue: &str,
    slots: &[ClaimSlot],
    handed: &[u32],
    held_for_units: bool,
) -> Result<Vec<String>, CoordinatorError> {
    let provider = literal::provider(&p.name)?;
    let now = literal::time(p.now);
    let mut out = Vec::new();
    let mut leaving = Vec::new();
    let mut latest: Option<DbTime> = None;
    let mut newcomer = false;
    let read_cut = p.waiters.len() >= MAX_WAITERS_READ;
    for (slot, got) in slots.iter().zip(handed) {
        let Some(WaiterTicket { id, ttl }) = slot.waiter else {
            continue;
        };
        let live = p.waiters.iter().find(|w| w.id == id);
        if *got == 0 && held_for_units {
            // A live registration with more than half its life left is
            // kept as it is: a look that changes nothing writes nothing.
            let half = chrono::TimeDelta::microseconds(ttl.as_micros() as i64 / 2);
            if live.is_some_and(|w| w.expires_at >= p.now + half) {
                continue;
            }
            newcomer |= live.is_none();
            let expires = p.now + half + half;
            latest = latest.max(Some(expires));
            out.push(
                include_str!("queries/waiters/register.sql")
                    .replace("{provider}", &provider)
                    .replace("{waiter}", &id.to_string())
                    .replace("{queue}", &literal::queue(queue)?)
                    .replace("{now}", &now)
                    .replace("{expires}", &literal::time(expires)),
            );
        } else if live.is_some() || read_cut {
            // Past a cut read a registration may be there unseen: taken
            // off all the same, or it would hold a turn for a Claim gone.
            leaving.push(id.to_string());
        }
    }
    if let Some(expires) = latest.filter(|e| p.waiters_until.is_none_or(|u| u < *e)) {
        out.push(
            include_str!("queries/waiters/until.sql")
                .replace("{provider}", &provider)
                .replace("{expires}", &literal::time(expires)),
        );
    }
    // Lapsed waiters (a crashed coordinator's) go when a waiter leaves or
    // a new one is written down.
    if !leaving.is_empty() || newcomer {
        if leaving.is_empty() {
            leaving.push("0".into());
        }
        out.push(
            include_str!("queries/waiters/leave.sql")
                .replace("{provider}", &provider)
                .replace("{waiters}", &leaving.join(", "))
                .replace("{now}", &now),
        );
    }
    Ok(out)
}
