//! The process failures of the demo: freeze a worker while it holds jobs
//! and resume it once a takeover superseded them (so its late writes are
//! fenced out for real), kill another mid-request, restart the coordinator.

use super::Cluster;
use anyhow::Result;
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::time::Duration;

/// The failures the demo makes happen, in order.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Chaos {
    /// Freeze the first worker once it holds running jobs.
    Pause,
    /// Resume it once every job it held was taken over by someone else.
    Resume(Vec<(u64, u64)>),
    /// Kill the second worker mid-request, and start a replacement.
    Kill,
    /// Restart the coordinator.
    Restart,
}

/// Jobs `owner` holds: (id, attempt).
async fn held_by(pool: &MySqlPool, owner: &str) -> Result<Vec<(u64, u64)>> {
    let rows =
        sqlx::query("SELECT id, attempt FROM jobs WHERE state = 'running' AND lease_owner = ?")
            .bind(owner)
            .fetch_all(pool)
            .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, r.try_get("attempt")?)))
        .collect()
}

/// Of these (id, attempt): `None` while one is still running under that
/// attempt, else how many were superseded by a takeover (the others the
/// holder finished itself, with a write already on its way when it froze).
async fn taken_over(pool: &MySqlPool, held: &[(u64, u64)]) -> Result<Option<usize>> {
    let mut superseded = 0;
    for (id, attempt) in held {
        let row =
            sqlx::query("SELECT attempt, state = 'running' AS running FROM jobs WHERE id = ?")
                .bind(id)
                .fetch_one(pool)
                .await?;
        let now: u64 = row.try_get("attempt")?;
        let running: i64 = row.try_get("running")?;
        if now > *attempt {
            superseded += 1;
        } else if running != 0 {
            return Ok(None);
        }
    }
    Ok(Some(superseded))
}

/// Tries one failure; `Some((what happened, follow-up))` once it happened.
pub(super) async fn chaos_step(
    cluster: &mut Cluster,
    pool: &MySqlPool,
    step: Chaos,
    elapsed: Duration,
) -> Result<Option<(String, Option<Chaos>)>> {
    Ok(match step {
        Chaos::Pause if elapsed >= Duration::from_secs(1) => {
            let name = cluster.workers[0].name.clone();
            let held = held_by(pool, &name).await?;
            if held.is_empty() {
                return Ok(None);
            }
            cluster.workers[0].pause()?;
            Some((
                format!("{name} frozen (SIGSTOP) holding {} jobs", held.len()),
                Some(Chaos::Resume(held)),
            ))
        }
        Chaos::Resume(held) => {
            let Some(superseded) = taken_over(pool, &held).await? else {
                return Ok(None);
            };
            cluster.workers[0].resume()?;
            let name = &cluster.workers[0].name;
            if superseded == 0 {
                // Its writes were already on their way: no zombie yet.
                // Freeze it again later, so one really is.
                return Ok(Some((
                    format!("{name} resumed: it had finished its jobs; freezing it again"),
                    Some(Chaos::Pause),
                )));
            }
            Some((
                format!("{name} resumed after {superseded} of its jobs were taken over"),
                None,
            ))
        }
        Chaos::Kill if cluster.workers.len() > 1 && elapsed >= Duration::from_millis(1500) => {
            let name = cluster.workers[1].name.clone();
            if held_by(pool, &name).await?.is_empty() {
                return Ok(None);
            }
            cluster.workers[1].kill().await?;
            cluster.workers[1] = cluster.rust_worker(&format!("{name}-restarted"), 8)?;
            Some((
                format!("{name} killed mid-request (SIGKILL), replaced"),
                None,
            ))
        }
        Chaos::Kill if cluster.workers.len() <= 1 => {
            Some(("no second worker to kill".to_owned(), None))
        }
        Chaos::Kill => None,
        Chaos::Restart if elapsed >= Duration::from_secs(2) => {
            cluster.restart_coordinator().await?;
            Some(("coordinator restarted (SIGTERM, start)".to_owned(), None))
        }
        Chaos::Pause | Chaos::Restart => None,
    })
}
