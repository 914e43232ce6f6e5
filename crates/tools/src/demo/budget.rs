//! The provider's rate limit and the budget that keeps the demo under it
//! (docs/design.md rules 11–13). The fake provider answers `429` past
//! `--provider-rate-limit`; unless `--no-budget`, the demo puts a budget of
//! [`BUDGET_SHARE`] of that limit on its queue through JobAdmin
//! (`PutProvider`, with the operator's credentials), so every coordinator
//! hands out only what the provider will accept.
//!
//! Why that gives 0 × 429 by construction, not by luck:
//!
//! 1. **Costs cover every call.** A hand-out costs [`EXECUTE_COST`] or
//!    [`RECONCILE_COST`] units, the most provider calls one hand-out can
//!    cause in any of the three refund workers: the Rust one makes at most
//!    one for an execute (the send, or the check of evidence handed over
//!    with it) and two for a reconcile (that check, then the lookup); the
//!    Python, Node and Go ones one either way, and none of them retries a
//!    call within a hand-out (`crates/tools/src/refund_worker/handler.rs`,
//!    `sdk/python/src/jobfence_worker/refund_worker.py`,
//!    `sdk/node/src/refund_worker.js`, `sdk/go/refund/refund.go`).
//! 2. **The rate is under the limit.** Over any `W` seconds the budget
//!    spends at most `b + 0.8·L·W` units (`b` its burst, `L` the limit),
//!    so the calls of the hand-outs made in that window are at most that.
//! 3. **The provider's burst covers the timing.** A call comes a little
//!    after its hand-out, and a frozen worker makes its calls long after;
//!    but only for jobs a worker still holds, and the workers hold at most
//!    their slots ([`Fleet::calls_held`]: slots × calls per hand-out). So a
//!    window of `W` seconds sees at most `b + held + 0.8·L·W` calls, and the
//!    provider admits `B + L·W` (its GCRA burst `B`): the demo gives the
//!    provider a burst of at least `b + held` ([`Plan::new`]).
//!
//! Hand-outs that reach no worker (an unclear commit, a coordinator killed
//! mid-claim) spend units and make no call: they only make the budget
//! stricter.

use anyhow::{bail, Context, Result};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{ProviderBudget, PutProviderRequest};

/// The share of the provider's limit the budget hands out.
pub const BUDGET_SHARE: f64 = 0.8;
/// Units a hand-out with next_action EXECUTE costs: the refund workers make
/// at most one provider call for it.
pub const EXECUTE_COST: u32 = 1;
/// Units a hand-out with next_action RECONCILE costs: the Rust refund worker
/// may check the evidence handed over with the claim before its lookup.
pub const RECONCILE_COST: u32 = 2;
/// Jobs the Python refund worker holds at once (`--batch`: its run loop's
/// concurrency).
pub const PYTHON_BATCH: u32 = 4;
/// The provider's name (one per database with `--shards`: `-1`, `-2`, …).
pub const PROVIDER: &str = "fake-provider";

/// The workers the demo runs: what bounds the provider calls still to come
/// from jobs already handed out.
#[derive(Debug, Clone, Copy)]
pub struct Fleet {
    pub rust: u32,
    pub python: u32,
    pub node: u32,
    pub go: u32,
    /// Jobs each Rust, Node and Go worker handles at once.
    pub concurrency: u32,
}

impl Fleet {
    /// Jobs the workers can hold at once.
    pub fn slots(&self) -> u32 {
        (self.rust + self.node + self.go) * self.concurrency + self.python * PYTHON_BATCH
    }

    /// The most provider calls that can still come from jobs the workers
    /// hold at any moment: each Rust slot up to [`RECONCILE_COST`] calls,
    /// each Python, Node or Go slot one.
    pub fn calls_held(&self) -> u32 {
        self.rust * self.concurrency * RECONCILE_COST.max(EXECUTE_COST)
            + self.python * PYTHON_BATCH
            + (self.node + self.go) * self.concurrency
    }
}

/// One database's budget (the demo's queue of that database).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub rate_per_second: f64,
    pub burst: u32,
}

/// The provider's limit and the budget under it.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Requests per second the provider accepts, every endpoint together.
    pub limit: f64,
    /// Requests it accepts at once (its GCRA burst).
    pub provider_burst: u32,
    /// The budget of each database's queue; `None` with `--no-budget`.
    pub budget: Option<Budget>,
    /// Databases, each with its own queue and budget (`--shards`).
    pub databases: u32,
}

impl Plan {
    /// The plan for a limit of `limit` requests per second: a budget of
    /// [`BUDGET_SHARE`] of it (split evenly over `databases`, since a
    /// provider's budget is one row of one database and the demo puts one
    /// queue on each), with a burst of a tenth of a second's worth (at least
    /// one reconcile); and a provider burst of one second's worth, or more
    /// if `fleet` could otherwise outrun it (see the module comment).
    pub fn new(limit: f64, with_budget: bool, databases: u32, fleet: Fleet) -> Result<Plan> {
        if !(limit.is_finite() && limit > 0.0 && limit <= 1_000_000.0) {
            bail!("--provider-rate-limit must be a positive number up to 1000000, got {limit}");
        }
        let databases = databases.max(1);
        let rate = limit * BUDGET_SHARE / databases as f64;
        let budget = Budget {
            rate_per_second: rate,
            burst: ((rate / 10.0).ceil() as u32).max(RECONCILE_COST),
        };
        let provider_burst =
            (limit.ceil() as u32).max(budget.burst * databases + fleet.calls_held());
        Ok(Plan {
            limit,
            provider_burst,
            budget: with_budget.then_some(budget),
            databases,
        })
    }

    /// The `jobfence fake-provider` flags of the limit.
    pub fn provider_flags(&self) -> Vec<String> {
        vec![
            "--rate-limit".into(),
            self.limit.to_string(),
            "--rate-limit-burst".into(),
            self.provider_burst.to_string(),
        ]
    }

    /// The limit, as the report and the progress say it.
    pub fn limit_text(&self) -> String {
        format!(
            "{} requests/s (burst {})",
            number(self.limit),
            self.provider_burst
        )
    }

    /// The budget, as the report and the progress say it.
    pub fn budget_text(&self) -> String {
        match &self.budget {
            None => "off (--no-budget)".to_owned(),
            Some(b) => {
                let each = if self.databases > 1 {
                    format!("{} × ", self.databases)
                } else {
                    String::new()
                };
                format!(
                    "{each}{} units/s (burst {}), execute {EXECUTE_COST}, reconcile {RECONCILE_COST}: \
                     {}% of the limit",
                    number(b.rate_per_second),
                    b.burst,
                    number(BUDGET_SHARE * 100.0)
                )
            }
        }
    }

    /// Puts the budget on `queues` (queue k lives on database k) through
    /// JobAdmin at `addr`, as `operator`; nothing without a budget.
    pub async fn put(
        &self,
        addr: &str,
        credentials: &jobfence_worker::Credentials,
        operator: &str,
        queues: &[String],
    ) -> Result<()> {
        let Some(budget) = self.budget else {
            return Ok(());
        };
        let channel = credentials
            .endpoint(format!("http://{addr}"))?
            .connect()
            .await
            .context("connecting to the coordinators to put the provider budget")?;
        let mut admin = JobAdminClient::with_interceptor(channel, credentials.authorization());
        for (k, queue) in queues.iter().enumerate() {
            let name = if queues.len() > 1 {
                format!("{PROVIDER}-{k}")
            } else {
                PROVIDER.to_owned()
            };
            admin
                .put_provider(PutProviderRequest {
                    name,
                    budget: Some(ProviderBudget {
                        rate_per_second: budget.rate_per_second,
                        burst: budget.burst,
                        max_in_flight: None,
                        execute_cost: Some(EXECUTE_COST),
                        reconcile_cost: Some(RECONCILE_COST),
                        key_share: None,
                        max_in_flight_per_key: None,
                    }),
                    queues: vec![queue.clone()],
                    operator: operator.to_owned(),
                    reason: format!(
                        "jobfence demo: {}% of the fake provider's limit of {} requests/s",
                        number(BUDGET_SHARE * 100.0),
                        number(self.limit)
                    ),
                })
                .await
                .map_err(|s| anyhow::anyhow!(jobfence_operator::describe_status(&s)))
                .context("putting the provider budget")?;
        }
        Ok(())
    }
}

/// A rate without trailing zeros (`150`, `120`, `0.5`).
fn number(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLEET: Fleet = Fleet {
        rust: 3,
        python: 1,
        node: 1,
        go: 1,
        concurrency: 16,
    };

    #[test]
    fn the_budget_is_under_the_limit_and_the_provider_burst_covers_what_workers_hold() {
        let plan = Plan::new(150.0, true, 1, FLEET).unwrap();
        let b = plan.budget.unwrap();
        assert_eq!(b.rate_per_second, 120.0);
        assert_eq!(b.burst, 12);
        // 3 × 16 × 2 + 4 + 16 + 16 = 132 calls held, + 12 ≤ 150.
        assert_eq!(FLEET.calls_held(), 132);
        assert_eq!(plan.provider_burst, 150);
        assert_eq!(
            plan.provider_flags(),
            ["--rate-limit", "150", "--rate-limit-burst", "150"]
        );
        // A limit low for the fleet: the provider's burst grows instead.
        let low = Plan::new(40.0, true, 1, FLEET).unwrap();
        assert_eq!(low.budget.unwrap().burst, 4);
        assert_eq!(low.provider_burst, 136);
    }

    #[test]
    fn shards_split_the_budget_and_no_budget_keeps_the_limit() {
        let plan = Plan::new(150.0, true, 2, FLEET).unwrap();
        assert_eq!(plan.budget.unwrap().rate_per_second, 60.0);
        assert!(plan.budget_text().starts_with("2 × 60 units/s (burst 6)"));
        let off = Plan::new(150.0, false, 1, FLEET).unwrap();
        assert_eq!(off.budget, None);
        assert_eq!(off.budget_text(), "off (--no-budget)");
        assert_eq!(off.provider_burst, plan.provider_burst);
        assert!(Plan::new(0.0, true, 1, FLEET).is_err());
        assert!(Plan::new(f64::NAN, true, 1, FLEET).is_err());
    }
}
