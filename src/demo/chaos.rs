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
    /// SIGKILL the Galera node the coordinators write through (node 1),
    /// once the demo has run this long; it is started again in the
    /// background.
    KillNode(Duration),
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

/// Jobs `owner` holds: (id, attempt), in every database.
async fn held_by(pools: &[MySqlPool], owner: &str) -> Result<Vec<(u64, u64)>> {
    let mut held = Vec::new();
    for pool in pools {
        let rows =
            sqlx::query("SELECT id, attempt FROM jobs WHERE state = 'running' AND lease_owner = ?")
                .bind(owner)
                .fetch_all(pool)
                .await?;
        for r in rows {
            held.push((r.try_get("id")?, r.try_get("attempt")?));
        }
    }
    Ok(held)
}

/// The pool of the database that holds job `id` (ids name their database
/// when there are several).
fn pool_of(pools: &[MySqlPool], id: u64) -> &MySqlPool {
    let shard = crate::store::shards::shard_of(id) as usize;
    pools.get(shard).unwrap_or(&pools[0])
}

/// Of these (id, attempt): `None` while one is still running under that
/// attempt, else how many were superseded by a takeover (the others the
/// holder finished itself, with a write already on its way when it froze).
async fn taken_over(pools: &[MySqlPool], held: &[(u64, u64)]) -> Result<Option<usize>> {
    let mut superseded = 0;
    for (id, attempt) in held {
        let row =
            sqlx::query("SELECT attempt, state = 'running' AS running FROM jobs WHERE id = ?")
                .bind(id)
                .fetch_one(pool_of(pools, *id))
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

/// The node index `jobfence_database_node{database="0"}` reports (the
/// node of the list the coordinator writes through).
fn node_of(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with("jobfence_database_node{database=\"0\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// The sum of `jobfence_commit_outcome_unknown_total` over coordinators.
fn unknown_commits(metrics: &[String]) -> u64 {
    metrics
        .iter()
        .flat_map(|t| t.lines())
        .filter(|l| l.starts_with("jobfence_commit_outcome_unknown_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Tries one failure; `Some` once it happened.
pub(super) async fn chaos_step(
    cluster: &mut Cluster,
    pool: &[MySqlPool],
    step: Chaos,
    elapsed: Duration,
) -> Result<Option<Happened>> {
    Ok(match step {
        Chaos::Pause if elapsed >= Duration::from_secs(1) => {
            let name = cluster.workers[0].name.clone();
            let held =
                super::report::observe("the jobs a worker holds", || held_by(pool, &name)).await?;
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
            let Some(superseded) =
                super::report::observe("whether held jobs were taken over", || {
                    taken_over(pool, &held)
                })
                .await?
            else {
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
            if super::report::observe("the jobs a worker holds", || held_by(pool, &name))
                .await?
                .is_empty()
            {
                return Ok(None);
            }
            cluster.workers[1].kill().await?;
            // The replacement keeps its predecessor's queue served.
            let queue = cluster.queue_for_worker(1);
            cluster.workers[1] = cluster.rust_worker_on(
                &format!("{name}-restarted"),
                cluster.concurrency,
                &queue,
            )?;
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
                next: Some(if cluster.galera.is_some() {
                    Chaos::KillNode(elapsed + took.elapsed() + GAP)
                } else {
                    Chaos::KillCoordinator(elapsed + took.elapsed() + GAP)
                }),
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
        Chaos::KillNode(after) if elapsed >= after => {
            let script = cluster.galera.clone().expect("KillNode only with --galera");
            let from = SystemTime::now();
            let unknown_before = unknown_commits(&cluster.coordinators.scrape().await);
            let killed = std::time::Instant::now();
            let status = tokio::process::Command::new(&script)
                .args(["kill", "1"])
                .status()
                .await?;
            anyhow::ensure!(status.success(), "{} kill 1 failed", script.display());
            // Every coordinator reports which node it writes through.
            let moved = loop {
                let texts = cluster.coordinators.scrape().await;
                if texts.iter().all(|t| node_of(t) == Some(1)) {
                    break Some(killed.elapsed());
                }
                if killed.elapsed() > Duration::from_secs(30) {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            };
            cluster
                .coordinators
                .until_health(true, Duration::from_secs(30))
                .await?;
            let unknown = unknown_commits(&cluster.coordinators.scrape().await)
                .saturating_sub(unknown_before);
            cluster.node_restart = Some(
                tokio::process::Command::new(&script)
                    .args(["restart", "1"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()?,
            );
            Some(Happened {
                what: format!(
                    "Galera node 1 killed (SIGKILL) under load: every coordinator on node 2 after {}; \
                     commits answered COMMIT_OUTCOME_UNKNOWN: {unknown}; node 1 restarting",
                    moved.map_or("(not seen in 30 s)".to_owned(), |d| format!("{} ms", d.as_millis()))
                ),
                next: (cluster.coordinators.list.len() > 1)
                    .then(|| Chaos::KillCoordinator(elapsed + killed.elapsed() + GAP)),
                window: Some((from, SystemTime::now())),
            })
        }
        Chaos::Pause
        | Chaos::KillNode(_)
        | Chaos::Restart
        | Chaos::RollingRestart
        | Chaos::KillCoordinator(_)
        | Chaos::DatabaseOutage(_) => None,
    })
}
