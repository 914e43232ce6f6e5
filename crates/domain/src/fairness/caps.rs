//! Caps per fairness key of a provider's budget (docs/design.md rule
//! 18): at most `max_in_flight` jobs of one key in flight, and at most a
//! `share` of the provider's rate spent on one key while other keys have
//! due jobs. A claim skips a key at its cap and hands out the next key's
//! jobs; it never waits on it. With no other key due, a key may take the
//! whole budget.

use crate::budget::{Budget, Gcra, Holdback};
use crate::violation::FieldViolation;
use crate::DbTime;
use std::collections::HashMap;

/// The caps per fairness key of a provider's budget; both unset: none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KeyCaps {
    /// The most of the provider's rate one key may spend while others
    /// wait: more than 0, at most 1 (0.3: 30 %).
    pub share: Option<f64>,
    /// The most jobs of one key in flight (running with a live lease)
    /// over the provider's queues; at least 1.
    pub max_in_flight: Option<u32>,
}

impl KeyCaps {
    /// Whether any cap is set.
    pub fn any(&self) -> bool {
        self.share.is_some() || self.max_in_flight.is_some()
    }

    /// The budget of one key under `share` of `budget`: its rate times
    /// the share, a burst of the same share (at least one job's worth).
    pub fn key_budget(budget: &Budget, share: f64) -> Budget {
        let burst = (f64::from(budget.burst) * share).ceil() as u32;
        Budget {
            rate_per_second: budget.rate_per_second * share,
            burst: burst.max(budget.max_cost()),
            ..*budget
        }
    }

    /// The problems of the caps, named under `prefix`.
    pub fn violations(&self, prefix: &str) -> Vec<FieldViolation> {
        let mut v = Vec::new();
        if let Some(s) = self.share {
            if !(s.is_finite() && s > 0.0 && s <= 1.0) {
                v.push(FieldViolation::new(
                    format!("{prefix}key_share"),
                    format!("must be more than 0 and at most 1, a fraction of the rate (got {s})"),
                ));
            }
        }
        if self.max_in_flight == Some(0) {
            v.push(FieldViolation::new(
                format!("{prefix}max_in_flight_per_key"),
                "must be at least 1 when set",
            ));
        }
        v
    }
}

/// One key's state as a claim read it under the provider's lock: the
/// theoretical arrival time of its share (`None`: never spent), and its
/// jobs in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyState {
    pub tat: Option<DbTime>,
    pub in_flight: u64,
}

/// What a claim may still hand out per fairness key (see [`KeyCaps`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyAllowance {
    caps: KeyCaps,
    budget: Budget,
    now: DbTime,
    /// Whether more than one key has due jobs among the claim's
    /// candidates: the share applies only then.
    contested: bool,
    keys: HashMap<String, KeyState>,
    /// Units and jobs handed out per key by this claim.
    taken: HashMap<String, (u32, u32)>,
}

impl KeyAllowance {
    /// The allowance of a claim of a provider with `budget` and `caps`,
    /// at `now`, whose candidates' keys are `keys` (`""`: no key).
    pub fn new(
        caps: KeyCaps,
        budget: &Budget,
        now: DbTime,
        contested: bool,
        keys: HashMap<String, KeyState>,
    ) -> Self {
        KeyAllowance {
            caps,
            budget: *budget,
            now,
            contested,
            keys,
            taken: HashMap::new(),
        }
    }

    /// Takes one hand-out of `key` costing `cost`, or says it is capped.
    pub fn take(&mut self, key: &str, cost: u32) -> Result<(), Holdback> {
        self.check(key, cost)?;
        self.record(key, cost);
        Ok(())
    }

    /// Whether one more hand-out of `key` costing `cost` stays under the
    /// key's caps.
    pub fn check(&self, key: &str, cost: u32) -> Result<(), Holdback> {
        let state = self.keys.get(key);
        let (units, jobs) = self.taken.get(key).copied().unwrap_or((0, 0));
        if let Some(cap) = self.caps.max_in_flight {
            let in_flight = state.map_or(0, |s| s.in_flight) + u64::from(jobs);
            if in_flight >= u64::from(cap) {
                return Err(Holdback::KeyCap);
            }
        }
        if let (Some(share), true) = (self.caps.share, self.contested) {
            let key_budget = KeyCaps::key_budget(&self.budget, share);
            let tat = state.and_then(|s| s.tat).unwrap_or(self.now);
            if Gcra::at(&key_budget, tat, self.now).available() < units + cost {
                return Err(Holdback::KeyCap);
            }
        }
        Ok(())
    }

    /// Records one hand-out of `key` costing `cost`.
    pub fn record(&mut self, key: &str, cost: u32) {
        let t = self.taken.entry(key.to_owned()).or_default();
        t.0 += cost;
        t.1 += 1;
    }

    /// The new arrival time of each key's share after this claim, for the
    /// keys it spent on while the share applied.
    pub fn spent(&self) -> Vec<(String, DbTime)> {
        let Some(share) = self.caps.share.filter(|_| self.contested) else {
            return Vec::new();
        };
        let key_budget = KeyCaps::key_budget(&self.budget, share);
        let mut out: Vec<(String, DbTime)> = self
            .taken
            .iter()
            .filter(|(_, (units, _))| *units > 0)
            .map(|(key, (units, _))| {
                let tat = self.keys.get(key).and_then(|s| s.tat).unwrap_or(self.now);
                let gcra = Gcra::at(&key_budget, tat, self.now);
                (key.clone(), gcra.spend(self.now, *units))
            })
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> Budget {
        Budget {
            rate_per_second: 10.0,
            burst: 10,
            max_in_flight: None,
            execute_cost: 1,
            reconcile_cost: 1,
            per_key: KeyCaps::default(),
        }
    }

    fn now() -> DbTime {
        chrono::DateTime::from_timestamp(1_800_000_000, 0)
            .unwrap()
            .naive_utc()
    }

    #[test]
    fn a_contested_key_gets_its_share_of_the_burst_and_an_alone_key_all() {
        let caps = KeyCaps {
            share: Some(0.3),
            max_in_flight: None,
        };
        let mut a = KeyAllowance::new(caps, &budget(), now(), true, HashMap::new());
        let taken = (0..10).filter(|_| a.take("a", 1).is_ok()).count();
        assert_eq!(taken, 3, "30 % of a burst of 10");
        assert_eq!(a.spent().len(), 1);
        let mut alone = KeyAllowance::new(caps, &budget(), now(), false, HashMap::new());
        assert!((0..10).all(|_| alone.take("a", 1).is_ok()));
        assert!(alone.spent().is_empty(), "nothing owed when nobody waited");
    }

    #[test]
    fn the_in_flight_cap_counts_what_runs_and_what_the_claim_takes() {
        let caps = KeyCaps {
            share: None,
            max_in_flight: Some(2),
        };
        let keys = HashMap::from([(
            "a".to_owned(),
            KeyState {
                tat: None,
                in_flight: 1,
            },
        )]);
        let mut a = KeyAllowance::new(caps, &budget(), now(), false, keys);
        assert!(a.take("a", 1).is_ok());
        assert_eq!(a.take("a", 1), Err(Holdback::KeyCap));
        assert!(a.take("b", 1).is_ok() && a.take("b", 1).is_ok());
        assert_eq!(a.take("b", 1), Err(Holdback::KeyCap));
    }

    #[test]
    fn shares_outside_zero_to_one_are_refused() {
        for bad in [0.0, -0.1, 1.5, f64::NAN] {
            let caps = KeyCaps {
                share: Some(bad),
                max_in_flight: Some(0),
            };
            assert_eq!(caps.violations("budget.").len(), 2, "{bad}");
        }
    }
}
