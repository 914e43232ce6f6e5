//! Provider budgets (docs/design.md rules 11 and 12) as pure functions of what a
//! claim transaction read under the provider's row lock, by the database
//! clock.
//!
//! A budget is GCRA (the generic cell rate algorithm, a token bucket without
//! a refill task): one stored time per provider, the *theoretical arrival
//! time* `tat`. With the emission interval `T = 1 / rate` and the tolerance
//! `τ = burst × T`, `n` units may be spent at `now` while
//! `max(tat, now) + n × T ≤ now + τ`, and spending them moves `tat` to
//! `max(tat, now) + n × T`. Over any window of length `W`, at most
//! `burst + W × rate` units are spent, however many coordinators spend them,
//! because every spend happens under the same row lock and is committed with
//! the hand-out it pays for (a rolled-back claim spends nothing).
//!
//! A budget only ever *delays* a hand-out: it never changes a fenced write,
//! never turns a reconcile into a send, never lets a stale attempt write.

use super::{DbTime, NextAction, UnknownValue};
use crate::violation::FieldViolation;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub mod waiters;

/// Largest rate, burst and cost a budget accepts.
pub const MAX_RATE_PER_SECOND: f64 = 1_000_000.0;
/// Largest burst a budget accepts, in units.
pub const MAX_BURST: u32 = 1_000_000;
/// Largest cost of one hand-out, in units.
pub const MAX_COST: u32 = 1_000;
/// Longest throttle a worker may report (a provider's Retry-After).
pub const MAX_PROVIDER_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// How much may be handed out for one provider (stored in `providers`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// Units per second on average; positive and finite.
    pub rate_per_second: f64,
    /// Units that may be spent at once after an idle period; at least 1
    /// and at least the largest cost.
    pub burst: u32,
    /// Most jobs of the provider's queues running with a live lease at
    /// once; `None`: no cap.
    pub max_in_flight: Option<u32>,
    /// Units a hand-out with `execute` costs (a send).
    pub execute_cost: u32,
    /// Units a hand-out with `reconcile` costs (a lookup; a provider may
    /// need two).
    pub reconcile_cost: u32,
    /// Caps per fairness key (docs/design.md rule 18).
    pub per_key: crate::fairness::KeyCaps,
}

impl Budget {
    /// The units a hand-out with `action` spends.
    pub fn cost(&self, action: NextAction) -> u32 {
        match action {
            NextAction::Execute => self.execute_cost,
            NextAction::Reconcile => self.reconcile_cost,
        }
    }

    /// The largest cost of a hand-out.
    pub fn max_cost(&self) -> u32 {
        self.execute_cost.max(self.reconcile_cost)
    }

    /// The emission interval `T`, in microseconds (fractional).
    pub fn interval_us(&self) -> f64 {
        1_000_000.0 / self.rate_per_second
    }

    /// The tolerance `τ = burst × T`, in microseconds.
    pub fn tolerance_us(&self) -> f64 {
        f64::from(self.burst) * self.interval_us()
    }

    /// The problems of a budget, as field violations named under `prefix`
    /// (`budget.`); empty when it may be stored.
    pub fn violations(&self, prefix: &str) -> Vec<FieldViolation> {
        let mut v = Vec::new();
        let mut add = |field: &str, why: String| {
            v.push(FieldViolation::new(format!("{prefix}{field}"), why));
        };
        let rate = self.rate_per_second;
        if !rate.is_finite() || rate <= 0.0 {
            add(
                "rate_per_second",
                format!("must be a positive finite number of units per second (got {rate})"),
            );
        } else if rate > MAX_RATE_PER_SECOND {
            add(
                "rate_per_second",
                format!("must be at most {MAX_RATE_PER_SECOND} (got {rate})"),
            );
        }
        for (field, cost) in [
            ("execute_cost", self.execute_cost),
            ("reconcile_cost", self.reconcile_cost),
        ] {
            if cost == 0 {
                add(field, "must be at least 1 unit (unset means 1)".into());
            } else if cost > MAX_COST {
                add(field, format!("must be at most {MAX_COST} units"));
            }
        }
        if self.burst == 0 {
            add(
                "burst",
                "must be at least 1 unit: with no burst nothing is ever handed out".into(),
            );
        } else if self.burst > MAX_BURST {
            add("burst", format!("must be at most {MAX_BURST} units"));
        } else if self.burst < self.max_cost() {
            add(
                "burst",
                format!(
                    "must be at least the largest cost ({} units): a job that costs more than the burst is never handed out",
                    self.max_cost()
                ),
            );
        }
        if self.max_in_flight == Some(0) {
            add(
                "max_in_flight",
                "must be at least 1 when set (to stop hand-outs, pause the provider)".into(),
            );
        }
        v.extend(self.per_key.violations(prefix));
        v
    }
}

/// An operator's pause of a provider (stored in `providers.pause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Pause {
    /// Not paused.
    #[default]
    None,
    /// Nothing is handed out.
    All,
    /// Sends (`execute`) are held; reconciles go on within the budget.
    Sends,
}

impl Pause {
    /// The value stored in `providers.pause`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pause::None => "none",
            Pause::All => "all",
            Pause::Sends => "sends",
        }
    }

    /// True when a hand-out with `action` is held by this pause.
    pub fn holds(self, action: NextAction) -> bool {
        match self {
            Pause::None => false,
            Pause::All => true,
            Pause::Sends => action == NextAction::Execute,
        }
    }
}

impl FromStr for Pause {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Pause::None, Pause::All, Pause::Sends]
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownValue {
                kind: "pause",
                value: s.to_owned(),
            })
    }
}

impl fmt::Display for Pause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a job that was due was not handed out (the `cause` label of the
/// deferred hand-outs metric, and the refusal of a Takeover).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holdback {
    /// The rate budget has fewer units than the job costs.
    Rate,
    /// The provider's cap on jobs in flight is reached.
    InFlight,
    /// An operator paused the provider (or its sends).
    Paused,
    /// A worker reported the provider's 429; its Retry-After runs.
    Throttled,
    /// Another queue of the same provider waited longer for the units
    /// left, or a long-polling Claim (of any coordinator) is owed them
    /// first ([`waiters`]).
    FairShare,
    /// The job's fairness key is at its cap (its share of the rate, or its
    /// jobs in flight; docs/design.md rule 18): the claim skips the key.
    KeyCap,
}

impl Holdback {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Holdback::Rate => "rate",
            Holdback::InFlight => "in_flight",
            Holdback::Paused => "paused",
            Holdback::Throttled => "throttled",
            Holdback::FairShare => "fair_share",
            Holdback::KeyCap => "key_cap",
        }
    }
}

/// Microseconds from `a` to `b` (negative when `b` is earlier).
pub fn micros_between(a: DbTime, b: DbTime) -> i64 {
    (b - a).num_microseconds().unwrap_or(i64::MAX)
}

fn plus_micros(t: DbTime, us: f64) -> DbTime {
    let us = us.round().clamp(-9.0e15, 9.0e15) as i64;
    t.checked_add_signed(chrono::TimeDelta::microseconds(us))
        .unwrap_or(DbTime::MAX)
}

/// The GCRA state of one provider at `now` (DB clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gcra {
    /// `max(tat, now) − now`, in microseconds (never negative).
    backlog_us: f64,
    interval_us: f64,
    tolerance_us: f64,
    burst: u32,
}

impl Gcra {
    /// The state of a budget whose stored theoretical arrival time is `tat`.
    pub fn at(budget: &Budget, tat: DbTime, now: DbTime) -> Self {
        Gcra {
            backlog_us: micros_between(now, tat).max(0) as f64,
            interval_us: budget.interval_us(),
            tolerance_us: budget.tolerance_us(),
            burst: budget.burst,
        }
    }

    /// Whole units that may be spent now (0..=burst).
    pub fn available(&self) -> u32 {
        let room = self.tolerance_us - self.backlog_us;
        if room <= 0.0 {
            return 0;
        }
        // A hair of slack so that exactly one interval counts as one unit
        // despite the rounding of the stored microseconds.
        let units = ((room + 0.5) / self.interval_us).floor();
        (units.max(0.0) as u64).min(u64::from(self.burst)) as u32
    }

    /// How long until `cost` units may be spent (zero: now).
    pub fn due_in(&self, cost: u32) -> Duration {
        let wait = self.backlog_us + f64::from(cost) * self.interval_us - self.tolerance_us;
        if wait <= 0.5 {
            Duration::ZERO
        } else {
            Duration::from_micros(wait.ceil() as u64)
        }
    }

    /// The theoretical arrival time to store after spending `units` at
    /// `now` (the stored time unchanged when nothing is spent).
    pub fn spend(&self, now: DbTime, units: u32) -> DbTime {
        plus_micros(now, self.backlog_us + f64::from(units) * self.interval_us)
    }
}

/// A queue of a provider as a claim sees it when sharing the units left
/// between queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueShare {
    pub queue: String,
    /// When a claim of the queue last got units.
    pub last_granted_at: Option<DbTime>,
    /// When a claim of the queue last wanted jobs that were due and got
    /// fewer because of the budget.
    pub last_short_at: Option<DbTime>,
}

/// How long a queue cut short by the budget keeps a claim on its share:
/// `max(1 s, 2 × T)`, so a queue whose workers stopped asking stops
/// holding units for nobody after that.
pub fn fair_window(budget: &Budget) -> Duration {
    Duration::from_micros((2.0 * budget.interval_us()).ceil() as u64).max(Duration::from_secs(1))
}

/// The units a claim of `queue` may take of `available` when other queues
/// of the same provider also wait for them.
///
/// The queues that compete are those cut short by the budget within the
/// [`fair_window`] (the claiming queue always counts). Each claim takes at
/// most its share, `available / competing` rounded up, and never less
/// than one job's worth (the largest cost), so a share smaller than a job
/// cannot stall everyone. A queue also leaves one job's worth for every
/// competing queue served less recently than itself. Over successive
/// claims the queues therefore take turns, the one served longest ago
/// first, and none starves; with no other queue waiting a claim may take
/// everything.
pub fn fair_share(
    queue: &str,
    available: u32,
    shares: &[QueueShare],
    budget: &Budget,
    now: DbTime,
) -> u32 {
    let window = fair_window(budget);
    let since = now - chrono::TimeDelta::microseconds(window.as_micros() as i64);
    let others: Vec<&QueueShare> = shares
        .iter()
        .filter(|s| s.queue != queue && s.last_short_at.is_some_and(|t| t >= since))
        .collect();
    if others.is_empty() {
        return available;
    }
    let mine = shares
        .iter()
        .find(|s| s.queue == queue)
        .and_then(|s| s.last_granted_at);
    // Served less recently than this queue: never served (None sorts
    // first), or served earlier; ties broken by name, so two queues never
    // both defer to each other.
    let ahead = others
        .iter()
        .filter(|o| (o.last_granted_at, o.queue.as_str()) < (mine, queue))
        .count() as u32;
    let competing = others.len() as u32 + 1;
    let job = budget.max_cost();
    let share = available.div_ceil(competing).max(job);
    let left = available.saturating_sub(ahead.saturating_mul(job));
    share.min(left)
}

/// What a claim may still hand out for one provider: the units of the
/// rate budget (after the fair share), the room under the in-flight cap,
/// and the pause. Each job handed out is taken from it, in scan order.
#[derive(Debug, Clone, PartialEq)]
pub struct Allowance {
    /// Units that may still be spent.
    pub units: u32,
    /// Jobs that may still go in flight; `None`: no cap.
    pub in_flight_room: Option<u32>,
    pub pause: Pause,
    /// Hand-outs held until then by a worker's throttle report.
    pub throttled: bool,
    /// True when the units were cut below the rate budget by the fair
    /// share (a job refused for units is then `FairShare`, not `Rate`).
    pub shared: bool,
    /// Units spent so far.
    pub spent: u32,
    /// The caps per fairness key, when the provider has any.
    pub per_key: Option<crate::fairness::KeyAllowance>,
}

impl Allowance {
    /// No budget: everything may be handed out.
    pub fn unlimited() -> Self {
        Allowance {
            units: u32::MAX,
            in_flight_room: None,
            pause: Pause::None,
            throttled: false,
            shared: false,
            spent: 0,
            per_key: None,
        }
    }

    /// Takes one hand-out of a job of fairness key `key` (`""`: none)
    /// costing `cost` units with `action`, or says why it must wait: as
    /// [`take`](Self::take), and first the key's caps.
    pub fn take_for(&mut self, key: &str, action: NextAction, cost: u32) -> Result<(), Holdback> {
        if let Some(k) = &self.per_key {
            k.check(key, cost)?;
        }
        self.take(action, cost)?;
        if let Some(k) = self.per_key.as_mut() {
            k.record(key, cost);
        }
        Ok(())
    }

    /// Takes one hand-out costing `cost` units with `action`, or says why
    /// it must wait.
    pub fn take(&mut self, action: NextAction, cost: u32) -> Result<(), Holdback> {
        if self.pause.holds(action) {
            return Err(Holdback::Paused);
        }
        if self.throttled {
            return Err(Holdback::Throttled);
        }
        if self.in_flight_room == Some(0) {
            return Err(Holdback::InFlight);
        }
        if self.units < cost {
            return Err(if self.shared {
                Holdback::FairShare
            } else {
                Holdback::Rate
            });
        }
        self.units -= cost;
        self.spent += cost;
        if let Some(room) = self.in_flight_room.as_mut() {
            *room -= 1;
        }
        Ok(())
    }
}

/// What a claim did against its provider's budget, for the metrics and
/// for when to look again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetReport {
    /// The provider of the claim's queue.
    pub provider: String,
    /// Due jobs not handed out, by why.
    pub deferred: Vec<(Holdback, u32)>,
    /// Units left after the claim (at its clock).
    pub units_left: u32,
    /// Jobs in flight after the claim, when the provider has a cap.
    pub in_flight: Option<u64>,
}

#[cfg(test)]
mod tests;
