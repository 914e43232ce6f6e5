//! The provider budget inside a claim or takeover transaction (docs/design.md
//! rules 11–13): what the transaction reads of its queue's stored rules,
//! the provider row it locks, and the statements that spend the units it
//! hands out, committed with the hand-outs themselves.
//!
//! The reads come first in the claim's first round trip
//! (`queries/budget/rules.sql`; after the written job's lock in a Complete
//! or Fail that claims the next job): the provider's row and the rows of
//! its queues, the claim's own and the others, locked in one statement (the
//! provider's first), then the provider's jobs in flight (only when it has a cap; in a second round trip, still under
//! the provider's lock, when the queue's last claim found no cap). Claims
//! of one provider therefore queue on its row, on every coordinator, and
//! each sees what the previous one spent. A queue that no longer
//! dispatches to the provider locked is not among its queues: the claim
//! then reads the queue's own row ([`Rules::parse_or_own_row`]). Lock
//! order: the provider row, then its queues' rows in the order of their
//! names, before any job row (the claim scans skip locked rows and never
//! wait for one); a Takeover, a Fail, a Complete that claims the next
//! job, or a claim that read only its queue's row and found a provider
//! there after all, waits for a provider row holding only job rows; an
//! operator who locks a provider's queue rows holds the provider's row
//! first, or takes them in name order (docs/architecture.md, lock order).
//! So no cycle.

use super::literal;
use super::rows;
use jobfence_domain::budget::{
    fair_share, waiters, Allowance, Budget, Gcra, Holdback, Pause, QueueShare,
};
use jobfence_domain::{CoordinatorError, DbTime, Job, JobState, NextAction, QueuePolicy};
use sqlx::mysql::MySqlRow;
use std::sync::LazyLock;
use std::time::Duration;

/// The statements that read a queue's rules, `{queue}` filled in; see
/// [`Rules::parse`] for their results.
static RULES: LazyLock<[String; 2]> = LazyLock::new(|| {
    let text: &'static str = include_str!("queries/budget/rules.sql");
    let parts: Vec<String> = text
        .split(";\n")
        .map(literal::bare)
        .filter(|s| !s.trim().is_empty())
        .collect();
    parts
        .try_into()
        .expect("queries/budget/rules.sql holds two statements")
});

/// Number of result sets [`rules_statements`] produces.
pub(crate) const RULES_RESULTS: usize = 2;

/// The statements of [`RULES`] for `queue`, to be sent first in a claim or
/// takeover transaction, and (`own_row`) the queue's own row after them
/// (`queue_row.sql`, for a queue with no provider; see
/// [`Rules::parse_or_own_row`]).
pub(crate) fn rules_statements(
    queue: &str,
    own_row: bool,
) -> Result<Vec<String>, CoordinatorError> {
    let q = literal::queue(queue)?;
    let mut out: Vec<String> = RULES.iter().map(|s| s.replace("{queue}", &q)).collect();
    if own_row {
        out.push(
            literal::bare(include_str!("queries/budget/queue_row.sql")).replace("{queue}", &q),
        );
    }
    Ok(out)
}

/// The statement that reads only a queue's own row of `queue_policies`
/// (see `queries/budget/queue_row.sql`): for a claim of a queue with no
/// provider, one primary-key read instead of the statements of
/// [`rules_statements`]; and after them, when the queue is not among the
/// locked provider's queues. Its two parameters are the queue's name,
/// twice; prepared at a session's first prepared claim (see
/// `claim/scan.rs`, `prepared_reads`).
pub(crate) fn queue_row_template() -> String {
    literal::bare(include_str!("queries/budget/queue_row.sql")).replace("{queue}", "?")
}

/// The statements of [`rules_statements`] with the queue as a parameter,
/// for a claim of a queue with a provider, prepared like
/// [`queue_row_template`]: each one's text and how many times its one
/// parameter, the queue's name, is given (the provider's row and its
/// queues' rows, the jobs in flight).
pub(crate) fn rules_templates() -> [(String, usize); RULES_RESULTS] {
    RULES
        .clone()
        .map(|sql| (sql.replace("{queue}", "?"), sql.matches("{queue}").count()))
}

/// What a claim of a queue with a provider knew of it at its last claim
/// on this store: whether the provider had an in-flight cap (its claims
/// then count the jobs in flight in their first round trip).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProviderSeen {
    pub capped: bool,
    /// It had caps per fairness key: its claims scan more rows
    /// (`claim/key_caps.rs`).
    pub key_capped: bool,
}

/// The queues a store's last claims found a provider for: their claims
/// read the provider's row and the rules at once, the others only their
/// own row (and read the rules too when it names a provider after all).
#[derive(Debug, Default)]
pub(crate) struct ProviderQueues(std::sync::Mutex<std::collections::HashMap<String, ProviderSeen>>);

impl ProviderQueues {
    /// What the last claim of `queue` found: `None` for no provider.
    pub(crate) fn get(&self, queue: &str) -> Option<ProviderSeen> {
        self.0
            .lock()
            .expect("provider queues lock")
            .get(queue)
            .copied()
    }

    pub(crate) fn set(&self, queue: &str, seen: Option<ProviderSeen>) {
        let mut map = self.0.lock().expect("provider queues lock");
        match seen {
            Some(seen) if map.get(queue) != Some(&seen) => {
                map.insert(queue.to_owned(), seen);
            }
            None => {
                map.remove(queue);
            }
            Some(_) => {}
        }
    }
}

/// A queue's stored rules as its claim transaction read them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rules {
    /// The stored resend policy; `None`: the coordinator's flags decide.
    pub policy: Option<QueuePolicy>,
    /// The provider it dispatches to, its row locked by this transaction.
    pub provider: Option<LockedProvider>,
    /// An operator paused the queue itself: its claims hand out nothing.
    pub queue_paused: bool,
}

/// A provider row read under its lock.
#[derive(Debug, Clone)]
pub(crate) struct LockedProvider {
    pub name: String,
    pub budget: Budget,
    pub pause: Pause,
    pub tat: DbTime,
    pub throttled_until: Option<DbTime>,
    /// The DB clock when the row was locked.
    pub now: DbTime,
    /// Jobs of its queues in flight (only read when it has a cap).
    pub in_flight: Option<u64>,
    /// The DB clock the count of jobs in flight compared their leases
    /// with (with `in_flight`).
    pub counted_at: Option<DbTime>,
    /// Its queues, for sharing the units between them.
    pub shares: Vec<QueueShare>,
    /// Until when a waiter's registration may be live (`None`: none ever
    /// waited): its waiters are read only before then.
    pub waiters_until: Option<DbTime>,
    /// Its live waiters in turn order, when read
    /// ([`LockedProvider::load_waiters`]).
    pub waiters: Vec<crate::waiters::LiveWaiter>,
}

impl Rules {
    /// Decodes the result sets of [`rules_statements`] for `queue`: the
    /// provider's row joined to its queues' rows, then the count of jobs
    /// in flight (empty when the provider has no in-flight cap: a prepared
    /// claim sends the count only for a capped provider). `None` when the
    /// queue's own row is not among the locked provider's queues: the queue
    /// has no provider, or no longer this one (it changed since the claim
    /// last looked, or between the statement's look-up and the lock); the
    /// caller reads the queue's own row (see [`Rules::parse_or_own_row`]).
    pub fn parse(queue: &str, sets: &[Vec<MySqlRow>]) -> Result<Option<Rules>, CoordinatorError> {
        let [locked, in_flight] = sets else {
            return Err(CoordinatorError::Internal(format!(
                "the rules of a claim gave {} result sets, not {RULES_RESULTS}",
                sets.len()
            )));
        };
        let Some(own) = own_row(queue, locked)? else {
            return Ok(None);
        };
        let mut p = LockedProvider {
            name: rows::text(own, "name")?,
            budget: budget(own)?,
            pause: pause(own)?,
            tat: rows::time(own, "tat")?,
            throttled_until: rows::opt_time(own, "throttled_until")?,
            now: rows::time(own, "now")?,
            in_flight: None,
            counted_at: None,
            shares: Vec::new(),
            waiters_until: rows::opt_time(own, "waiters_until")?,
            waiters: Vec::new(),
        };
        if p.budget.max_in_flight.is_some() {
            // The count always answers one row: none means it was not
            // sent, and a cap must never be read as room.
            let Some(row) = in_flight.first() else {
                return Err(CoordinatorError::Internal(format!(
                    "the claim of queue {queue:?} did not count its provider's jobs in flight"
                )));
            };
            p.in_flight = Some(rows::get::<i64>(row, "in_flight")?.max(0) as u64);
            p.counted_at = Some(rows::time(row, "counted_at")?);
        }
        for row in locked {
            p.shares.push(QueueShare {
                queue: rows::text(row, "queue")?,
                last_granted_at: rows::opt_time(row, "last_granted_at")?,
                last_short_at: rows::opt_time(row, "last_short_at")?,
            });
        }
        Ok(Some(Rules {
            policy: stored_policy(own)?,
            provider: Some(p),
            queue_paused: rows::opt_time(own, "paused_at")?.is_some(),
        }))
    }

    /// [`Rules::parse`], and when the queue's own row is not among the
    /// locked provider's queues, the rules from that row alone (`own`, the
    /// result of `queue_row.sql`, read after the provider's lock): a queue
    /// with no provider. One that names a provider there (it moved to
    /// another between the look-up and the lock) is a
    /// `TransactionConflict`: the transaction runs again from the start.
    /// Also whether a lease of the queue has run out (`any_expired`).
    pub fn parse_or_own_row(
        queue: &str,
        sets: &[Vec<MySqlRow>],
        own: &[MySqlRow],
    ) -> Result<(Rules, bool), CoordinatorError> {
        if let Some(rules) = Rules::parse(queue, sets)? {
            return Ok((rules, Rules::expired_scan_wanted(queue, &sets[0])?));
        }
        Rules::from_queue_row(own)?.ok_or_else(|| {
            CoordinatorError::TransactionConflict(format!(
                "the provider of queue {queue:?} changed during its claim"
            ))
        })
    }
}

/// The row of `queue` among the rows of statement 1 of `rules.sql` (the
/// locked provider's queues; each names that provider, by the join).
fn own_row<'r>(
    queue: &str,
    locked: &'r [MySqlRow],
) -> Result<Option<&'r MySqlRow>, CoordinatorError> {
    for row in locked {
        if rows::text(row, "queue")? == queue {
            return Ok(Some(row));
        }
    }
    Ok(None)
}

impl Rules {
    /// The rules of a queue from its own row alone (the result of
    /// [`queue_row_template`]); `None` when the row names a provider:
    /// the claim must read the full rules, the provider's row locked.
    ///
    /// Also whether a lease of the queue has run out (its `any_expired`).
    pub fn from_queue_row(rows: &[MySqlRow]) -> Result<Option<(Rules, bool)>, CoordinatorError> {
        let Some(row) = rows.iter().next() else {
            return Err(CoordinatorError::Internal(
                "the queue's row statement gave no row".into(),
            ));
        };
        if rows::opt_text(row, "provider")?.is_some() {
            return Ok(None);
        }
        let rules = Rules {
            policy: stored_policy(row)?,
            provider: None,
            queue_paused: rows::opt_time(row, "paused_at")?.is_some(),
        };
        Ok(Some((rules, rows::get::<i64>(row, "any_expired")? != 0)))
    }

    /// Whether a claim of `queue` sends its expired-lease scan, from the
    /// first result set of [`rules_statements`] (the locked provider's
    /// queues): when a lease of the queue ran out (`any_expired`) and the
    /// queue is not paused (it hands out nothing); true when the queue's
    /// row is not there, so that the scan is sent rather than missed.
    pub fn expired_scan_wanted(queue: &str, locked: &[MySqlRow]) -> Result<bool, CoordinatorError> {
        match own_row(queue, locked)? {
            Some(row) => {
                let paused = rows::opt_time(row, "paused_at")?.is_some();
                Ok(rows::get::<i64>(row, "any_expired")? != 0 && !paused)
            }
            None => Ok(true),
        }
    }

    /// Whether `queue`'s own row is in the first result set of
    /// [`rules_statements`]: the queue dispatches to the provider locked.
    pub fn owns(queue: &str, locked: &[MySqlRow]) -> Result<bool, CoordinatorError> {
        Ok(own_row(queue, locked)?.is_some())
    }

    /// Whether the provider's row of [`rules_statements`] (in each row of
    /// its first result set) has an in-flight cap: the claim must then count the
    /// jobs in flight before it decides.
    pub fn capped(locked: &[MySqlRow]) -> Result<bool, CoordinatorError> {
        match locked.first() {
            Some(row) => Ok(rows::get::<Option<u32>>(row, "max_in_flight")?.is_some()),
            None => Ok(false),
        }
    }
}

/// The stored resend policy of a `queue_policies` row, if it has one.
pub(crate) fn stored_policy(row: &MySqlRow) -> Result<Option<QueuePolicy>, CoordinatorError> {
    let window: Option<u64> = rows::get(row, "resend_window_us")?;
    let max: Option<u32> = rows::get(row, "max_dispatches")?;
    Ok(match (window, max) {
        (Some(w), Some(m)) => Some(QueuePolicy {
            resend_window: Duration::from_micros(w),
            max_dispatches: m,
        }),
        _ => None,
    })
}

/// The `pause` column of a `providers` row.
pub(crate) fn pause(row: &MySqlRow) -> Result<Pause, CoordinatorError> {
    rows::text(row, "pause")?
        .parse()
        .map_err(|e| CoordinatorError::Internal(format!("providers.pause: {e}")))
}

/// The budget columns of a `providers` row.
pub(crate) fn budget(row: &MySqlRow) -> Result<Budget, CoordinatorError> {
    Ok(Budget {
        rate_per_second: rows::get(row, "rate_per_second")?,
        burst: rows::get(row, "burst")?,
        max_in_flight: rows::get(row, "max_in_flight")?,
        execute_cost: rows::get(row, "execute_cost")?,
        reconcile_cost: rows::get(row, "reconcile_cost")?,
        per_key: jobfence_domain::fairness::KeyCaps {
            share: rows::get(row, "key_share")?,
            max_in_flight: rows::get(row, "max_in_flight_per_key")?,
        },
    })
}

impl LockedProvider {
    /// The GCRA state at the lock's `now`.
    pub fn gcra(&self) -> Gcra {
        Gcra::at(&self.budget, self.tat, self.now)
    }

    /// True while a throttle report holds hand-outs.
    pub fn throttled(&self) -> bool {
        self.throttled_until.is_some_and(|t| t > self.now)
    }

    /// What a claim of `queue` whose slots carry the waiters `mine` may
    /// hand out now: its fair share of the units available less those
    /// owed to other waiters first (docs/design.md rule 11, "Waiters take
    /// turns"), the room under the in-flight cap, the pause and the
    /// throttle.
    pub fn allowance(&self, queue: &str, mine: &[u64]) -> Allowance {
        let available = self.gcra().available();
        let shared = fair_share(queue, available, &self.shares, &self.budget, self.now);
        let turns = waiters::turns(&self.waiter_ids(), mine, shared, self.budget.max_cost());
        let units = turns.units;
        Allowance {
            units,
            in_flight_room: self
                .budget
                .max_in_flight
                .map(|cap| (u64::from(cap).saturating_sub(self.in_flight.unwrap_or(0))) as u32),
            pause: self.pause,
            throttled: self.throttled(),
            shared: units < available,
            spent: 0,
            per_key: None,
        }
    }

    /// Leaves out of the count of jobs in flight those of `finishing` (jobs
    /// the same transaction takes out of `running`, locked by it before
    /// the count: a Complete or Fail that claims the next job) that the
    /// count counted: of the provider's queues, running with a lease past
    /// the count's clock. Its own finished job then leaves room under the
    /// cap, as a Complete and then a Claim would (docs/design.md rule 16).
    pub fn not_in_flight(&mut self, finishing: &[&Job]) {
        let (Some(n), Some(at)) = (self.in_flight, self.counted_at) else {
            return;
        };
        let counted = finishing
            .iter()
            .filter(|j| j.state == JobState::Running && j.lease_until.is_some_and(|l| l > at))
            .filter(|j| self.shares.iter().any(|s| s.queue == j.queue))
            .count();
        self.in_flight = Some(n.saturating_sub(counted as u64));
    }

    /// The cost of a hand-out with `action`.
    pub fn cost(&self, action: NextAction) -> u32 {
        self.budget.cost(action)
    }

    /// How long until a job held back for `why` could be handed out, as
    /// far as the provider row tells (`cost` units after `spent` were
    /// spent now); `None` when only an operator or a finished job can
    /// change it (a pause, the in-flight cap).
    pub fn due_in(&self, why: Holdback, spent: u32, cost: u32) -> Option<Duration> {
        match why {
            Holdback::Rate | Holdback::FairShare => {
                let after = Gcra::at(&self.budget, self.gcra().spend(self.now, spent), self.now);
                Some(after.due_in(cost))
            }
            Holdback::Throttled => self.throttled_until.map(|t| {
                Duration::from_micros(
                    jobfence_domain::budget::micros_between(self.now, t).max(0) as u64
                )
            }),
            // A key at its share: about when its next unit is due (the
            // key's interval); at its jobs in flight, a finished job.
            Holdback::KeyCap => self.budget.per_key.share.map(|share| {
                let rate = share * self.budget.rate_per_second;
                Duration::from_secs_f64(f64::from(cost.max(1)) / rate.max(1e-6))
            }),
            Holdback::Paused | Holdback::InFlight => None,
        }
    }

    /// The statements a claim of `queue` that spent `spent` units runs
    /// before its COMMIT: the new arrival time, when the queue was served,
    /// and (`short`) that it wanted jobs the budget held back. Text with
    /// literals (the claim's COMMIT round trip has no placeholders).
    pub fn after_claim(
        &self,
        queue: &str,
        spent: u32,
        short: bool,
    ) -> Result<Vec<String>, CoordinatorError> {
        let mut out = Vec::new();
        let q = literal::queue(queue)?;
        let now = literal::time(self.now);
        let fill = |sql: &str| sql.replace("{now}", &now).replace("{queue}", &q);
        if spent > 0 {
            out.push(
                include_str!("queries/budget/spend.sql")
                    .replace("{tat}", &literal::time(self.gcra().spend(self.now, spent)))
                    .replace("{provider}", &literal::provider(&self.name)?),
            );
            if self.shares.len() > 1 {
                out.push(fill(include_str!("queries/budget/granted.sql")));
            }
        }
        // A queue that shares its provider says it is waiting, at most a
        // few times per fair window (a write per empty claim would be a
        // commit per poll).
        if short && self.shares.len() > 1 {
            let window = jobfence_domain::budget::fair_window(&self.budget);
            let stale = self
                .shares
                .iter()
                .find(|s| s.queue == queue)
                .and_then(|s| s.last_short_at)
                .is_none_or(|t| {
                    jobfence_domain::budget::micros_between(t, self.now)
                        > (window.as_micros() / 4) as i64
                });
            if stale {
                out.push(fill(include_str!("queries/budget/short.sql")));
            }
        }
        Ok(out)
    }
}
