//! The process failures of the demo: freeze a worker while it holds jobs
//! and resume it once a takeover superseded them (so its late writes are
//! fenced out for real), kill another mid-request, restart the coordinator;
//! with several coordinators behind HAProxy, restart each in turn (a
//! rolling restart), kill one, and cut the database off for a few seconds.

use super::Cluster;
use anyhow::Result;
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::time::{Duration, SystemTime};

/// The failures the demo makes happen, in order.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Chaos {
    /// Freeze the first worker once it holds running jobs.
    Pause,
    /// Resume it once every job it held was taken over by someone else.
    Resume(Vec<(u64, u64)>),
    /// Kill the second worker mid-request, and start a replacement.
    Kill,
    /// Restart the coordinator (alone: no load balancer to hand calls to).
    Restart,
    /// Restart every coordinator in turn (SIGTERM, drain, start).
    RollingRestart,
    /// SIGKILL one coordinator, then start it again (once the demo has
    /// run this long).
    KillCoordinator(Duration),
    /// Cut every coordinator off the database for a few seconds (once the
    /// demo has run this long).
    DatabaseOutage(Duration),
}

/// The calm between two disturbances of the coordinators, so each one's
/// cost to the workers is counted apart.
const GAP: Duration = Duration::from_secs(2);

/// How long the demo keeps the database unreachable.
const OUTAGE: Duration = Duration::from_secs(3);

/// One failure that happened: what, what to try next, and when it lasted
/// (wall clock), for counting the calls workers saw fail meanwhile.
pub(super) struct Happened {
    pub what: String,
    pub next: Option<Chaos>,
    pub window: Option<(SystemTime, SystemTime)>,
}

fn happened(what: String, next: Option<Chaos>) -> Option<Happened> {
    Some(Happened {
        what,
        next,
        window: None,
    })
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

/// Tries one failure; `Some` once it happened.
pub(super) async fn chaos_step(
    cluster: &mut Cluster,
    pool: &MySqlPool,
    step: Chaos,
    elapsed: Duration,
) -> Result<Option<Happened>> {
    Ok(match step {
        Chaos::Pause if elapsed >= Duration::from_secs(1) => {
            let name = cluster.workers[0].name.clone();
            let held = held_by(pool, &name).await?;
            if held.is_empty() {
                return Ok(None);
            }
            cluster.workers[0].pause()?;
            happened(
                format!("{name} frozen (SIGSTOP) holding {} jobs", held.len()),
                Some(Chaos::Resume(held)),
            )
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
                return Ok(happened(
                    format!("{name} resumed: it had finished its jobs; freezing it again"),
                    Some(Chaos::Pause),
                ));
            }
            happened(
                format!("{name} resumed after {superseded} of its jobs were taken over"),
                None,
            )
        }
        Chaos::Kill if cluster.workers.len() > 1 && elapsed >= Duration::from_millis(1500) => {
            let name = cluster.workers[1].name.clone();
            if held_by(pool, &name).await?.is_empty() {
                return Ok(None);
            }
            cluster.workers[1].kill().await?;
            cluster.workers[1] = cluster.rust_worker(&format!("{name}-restarted"), 8)?;
            happened(
                format!("{name} killed mid-request (SIGKILL), replaced"),
                None,
            )
        }
        Chaos::Kill if cluster.workers.len() <= 1 => {
            happened("no second worker to kill".to_owned(), None)
        }
        Chaos::Kill => None,
        Chaos::Restart if elapsed >= Duration::from_secs(2) => {
            let from = SystemTime::now();
            cluster.coordinators.restart(0).await?;
            Some(Happened {
                what: "coordinator restarted (SIGTERM, start)".to_owned(),
                next: None,
                window: Some((from, SystemTime::now())),
            })
        }
        Chaos::RollingRestart if elapsed >= Duration::from_secs(2) => {
            let from = SystemTime::now();
            let took = std::time::Instant::now();
            let mut stops = Vec::new();
            for i in 0..cluster.coordinators.list.len() {
                let took = cluster.coordinators.restart(i).await?;
                stops.push(format!("{:.1}", took.as_secs_f64()));
            }
            Some(Happened {
                what: format!(
                    "rolling restart of {} coordinators (SIGTERM, drain, start; stopped in {} s)",
                    stops.len(),
                    stops.join(" / ")
                ),
                next: Some(Chaos::KillCoordinator(elapsed + took.elapsed() + GAP)),
                window: Some((from, SystemTime::now())),
            })
        }
        Chaos::KillCoordinator(after) if elapsed >= after => {
            let from = SystemTime::now();
            let took = std::time::Instant::now();
            let last = cluster.coordinators.list.len() - 1;
            let name = cluster.coordinators.list[last].name.clone();
            let noticed = cluster.coordinators.kill(last).await?;
            Some(Happened {
                what: format!(
                    "{name} killed (SIGKILL), restarted; HAProxy took it out after {}",
                    noticed.map_or("(not seen)".to_owned(), |d| format!("{} ms", d.as_millis()))
                ),
                next: Some(Chaos::DatabaseOutage(elapsed + took.elapsed() + GAP)),
                window: Some((from, SystemTime::now())),
            })
        }
        Chaos::DatabaseOutage(after) if elapsed >= after => {
            let from = SystemTime::now();
            let (down, up) = cluster.coordinators.database_outage(OUTAGE).await?;
            Some(Happened {
                what: format!(
                    "database unreachable for {} s (connections cut): NOT_SERVING after {} ms, \
                     SERVING again {} ms after it was back",
                    OUTAGE.as_secs(),
                    down.as_millis(),
                    up.as_millis()
                ),
                next: None,
                window: Some((from, SystemTime::now())),
            })
        }
        Chaos::Pause
        | Chaos::Restart
        | Chaos::RollingRestart
        | Chaos::KillCoordinator(_)
        | Chaos::DatabaseOutage(_) => None,
    })
}
