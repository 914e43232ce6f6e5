//! The benchmark's phases with a provider budget: one far above the load
//! (what the budget row costs every claim) and one below it (the pace the
//! database records).

use super::report::Phase;
use super::{direct, fill, grpc, handed_out, Bench, BenchArgs, PROVIDER, QUEUE};
use anyhow::{ensure, Result};
use jobfence_store::JobStore;
use std::time::{Duration, Instant};

impl Bench {
    /// The direct lifecycle and the coordinator's phases again with the
    /// queue under a provider budget far above the load: what the budget
    /// row in every claim transaction costs, on both loops, and what it
    /// costs a worker keeping the same budget in its own SQL.
    pub(super) async fn far_budget(
        &mut self,
        args: &BenchArgs,
        addr: &str,
        n: usize,
    ) -> Result<()> {
        self.with_budget(1_000_000.0, 1_000_000).await?;
        let pool = self.pool.clone();
        let mut measured = self
            .lifecycle(Phase::DirectBudget, n, args.jobs, || {
                direct::lifecycle(&pool, QUEUE, n, Some(PROVIDER))
            })
            .await;
        if measured.is_ok() {
            measured = self
                .lifecycle(Phase::CoordinatorBudget, n, args.jobs, || {
                    grpc::lifecycle(addr, QUEUE, n, 1, args.jobs)
                })
                .await;
        }
        if measured.is_ok() {
            measured = self
                .lifecycle(Phase::CoordinatorNextBudget, n, args.jobs, || {
                    grpc::lifecycle_next(addr, QUEUE, n, args.jobs)
                })
                .await;
        }
        self.without_budget().await?;
        measured
    }

    /// Puts the benchmark queue under provider [`PROVIDER`] with this
    /// budget.
    async fn with_budget(&self, rate: f64, burst: u32) -> Result<()> {
        use jobfence_domain::budget::Budget;
        use jobfence_domain::providers::{ChangeBy, PutProvider};
        JobStore::new(self.pool.clone())
            .put_provider(&PutProvider {
                name: PROVIDER.into(),
                budget: Budget {
                    rate_per_second: rate,
                    burst,
                    max_in_flight: None,
                    execute_cost: 1,
                    reconcile_cost: 1,
                    per_key: Default::default(),
                },
                queues: vec![QUEUE.into()],
                by: ChangeBy {
                    operator: "bench".into(),
                    reason: "benchmark phase".into(),
                },
            })
            .await?;
        // A fresh budget: its whole burst, from now.
        sqlx::query("UPDATE providers SET tat = UTC_TIMESTAMP(6) WHERE name = ?")
            .bind(PROVIDER)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Takes the benchmark queue out of every budget.
    async fn without_budget(&self) -> Result<()> {
        use jobfence_domain::providers::ChangeBy;
        let store = JobStore::new(self.pool.clone());
        if store.get_provider(PROVIDER).await?.is_some() {
            store
                .delete_provider(
                    PROVIDER,
                    &ChangeBy {
                        operator: "bench".into(),
                        reason: "benchmark phase over".into(),
                    },
                )
                .await?;
        }
        Ok(())
    }

    /// The paced phase: a budget below the load, `workers` long-polling
    /// workers for `--budget-seconds`, and the hand-out rate the database
    /// recorded (the `claimed` events, DB clock) after the initial burst.
    /// Checked: no job was handed out or completed twice.
    pub(super) async fn paced(
        &mut self,
        args: &BenchArgs,
        addr: &str,
        workers: usize,
    ) -> Result<()> {
        let rate = args.budget_rate;
        let burst = ((rate / 10.0).ceil() as u32).max(1);
        let seconds = args.budget_seconds.max(1);
        for _ in 0..args.repeat.max(1) {
            self.reset().await?;
            let jobs = (rate * (seconds + 5) as f64) as u64 + u64::from(burst);
            fill(&self.pool, jobs).await?;
            self.with_budget(rate, burst).await?;
            let phase = Phase::BudgetPaced {
                rate_milli: (rate * 1000.0) as u64,
                burst,
            };
            let label = format!("{} N={workers}", phase.name());
            eprint!("bench: {label:<44} ");
            let until = Instant::now() + Duration::from_secs(seconds);
            let measured = self
                .measure(phase, workers, || {
                    grpc::lifecycle_until(addr, QUEUE, workers, 1, Some(until), true)
                })
                .await;
            self.without_budget().await?;
            let mut measured = measured?;
            let (handed, span) = handed_out(&self.pool).await?;
            ensure!(
                handed > u64::from(burst),
                "{label}: only {handed} jobs handed out"
            );
            // The pace after the burst, by the database clock.
            measured.run.jobs = handed - u64::from(burst);
            measured.run.elapsed = span;
            eprintln!(
                "{:>8.1} hand-outs/s against a budget of {rate}/s (burst {burst}; checked: none twice)",
                measured.rate()
            );
            self.measured.push(measured);
        }
        Ok(())
    }
}
