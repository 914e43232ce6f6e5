//! What the provider reference's index costs the writes
//! (`--compare-reference-index`): the next-job loop (each Complete records
//! the job's provider reference, which moves its entry in
//! `ix_jobs_provider_reference`) and the Enqueue RPC (each new job's
//! entry, NULL until a reference is recorded), each run again right after
//! its ordinary phase with that index dropped, and the index built again
//! before anything else runs. The index serves settlement's match of a
//! line that names no operation key (docs/design.md rule 15; migration
//! 20261215000001).

use super::report::{Measured, Phase, Report};
use super::{grpc, Bench, BenchArgs, QUEUE};
use anyhow::Result;
use sqlx::mysql::MySqlPool;

const DROP: &str = "ALTER TABLE jobs DROP INDEX ix_jobs_provider_reference";
const ADD: &str = "CREATE INDEX ix_jobs_provider_reference ON jobs (queue, provider_reference)";

/// Runs `ran` with the index dropped, and builds it again whatever `ran`
/// did.
async fn without<T>(
    pool: &MySqlPool,
    ran: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    sqlx::query(DROP).execute(pool).await?;
    let out = ran.await;
    sqlx::query(ADD).execute(pool).await?;
    out
}

impl Bench {
    /// The next-job loop at `n` workers without the index (when
    /// `--compare-reference-index`).
    pub(super) async fn next_without_reference_index(
        &mut self,
        args: &BenchArgs,
        addr: &str,
        n: usize,
    ) -> Result<()> {
        if !args.compare_reference_index {
            return Ok(());
        }
        let pool = self.pool.clone();
        let jobs = args.jobs;
        let phase = Phase::CoordinatorNextNoReferenceIndex;
        without(
            &pool,
            self.lifecycle(phase, n, jobs, || {
                grpc::lifecycle_next(addr, QUEUE, n, jobs)
            }),
        )
        .await
    }

    /// The Enqueue RPC without the index (when `--compare-reference-index`).
    pub(super) async fn enqueue_without_reference_index(
        &mut self,
        args: &BenchArgs,
        addr: &str,
    ) -> Result<()> {
        if !args.compare_reference_index {
            return Ok(());
        }
        let pool = self.pool.clone();
        let (jobs, callers) = (args.enqueue_jobs, args.enqueue_callers);
        without(
            &pool,
            self.enqueue(Phase::EnqueueNoReferenceIndex, callers, jobs, || {
                grpc::enqueue(addr, QUEUE, jobs, callers, 1)
            }),
        )
        .await
    }
}

impl Report<'_> {
    /// The database CPU per job with the index over without it, round by
    /// round (each pair ran seconds apart), per phase and worker count, as
    /// sentences; `None` when the comparison did not run.
    pub(super) fn reference_index_rounds(&self) -> Option<String> {
        let mut out = Vec::new();
        let mut pairs = |with: Phase, without: Phase, n: usize, what: String| {
            let ratios = self.paired_db_cpu(with, without, n);
            let rates: Vec<String> = self
                .measured
                .iter()
                .filter(|m| m.phase == with && m.workers == n)
                .zip(
                    self.measured
                        .iter()
                        .filter(|m| m.phase == without && m.workers == n),
                )
                .map(|(a, b): (&Measured, &Measured)| format!("{:.2}", a.rate() / b.rate()))
                .collect();
            if !rates.is_empty() {
                let cpu: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
                out.push(format!(
                    "{what}: with the provider reference's index × without it, round by \
                     round: database CPU per job {}; jobs/s {}",
                    if cpu.is_empty() {
                        "not read".to_owned()
                    } else {
                        cpu.join(", ")
                    },
                    rates.join(", ")
                ));
            }
        };
        for &n in &self.args.workers {
            pairs(
                Phase::CoordinatorNext,
                Phase::CoordinatorNextNoReferenceIndex,
                n,
                format!("Next job on Complete, {n} workers"),
            );
        }
        pairs(
            Phase::Enqueue,
            Phase::EnqueueNoReferenceIndex,
            self.args.enqueue_callers,
            format!("Enqueue RPC, {} callers", self.args.enqueue_callers),
        );
        (!out.is_empty()).then(|| out.join("\n\n"))
    }
}
