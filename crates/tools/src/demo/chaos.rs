//! The process failures of the demo: freeze a worker while it holds jobs
//! and resume it once a takeover superseded them (so its late writes are
//! fenced out for real), kill another mid-request, restart the coordinator;
//! with several coordinators behind HAProxy, restart each in turn (a
//! rolling restart), kill one, and cut the database off for a few seconds.
//! After the first disturbance of the coordinators comes a takeover storm:
//! every coordinator stopped for longer than the lease while the workers
//! hold jobs and refunds keep arriving, so that when they come back every
//! held lease has expired at once and the backlog floods the provider (the
//! provider budget's test, docs/design.md rule 11).

use super::report::Storm;
use super::Cluster;
use anyhow::Result;
use jobfence_fake_provider::FaultConfig;
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::time::{Duration, Instant, SystemTime};

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
    /// The takeover storm (once the demo has run this long): SIGKILL every
    /// coordinator at once, keep them down for longer than the lease,
    /// start them all again.
    Storm(Duration),
    /// Wait until the storm's expired leases are taken over and their
    /// reconciles written back.
    StormDrain(StormWatch),
}

/// The leases the storm let expire, and when the coordinators were back.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StormWatch {
    /// (id, attempt) of every job running with an expired lease just
    /// before the coordinators started again.
    expired: Vec<(u64, u64)>,
    back: Instant,
}

/// The calm between two disturbances of the coordinators, so each one's
/// cost to the workers is counted apart.
const GAP: Duration = Duration::from_secs(2);

/// How long the demo keeps the database unreachable.
const OUTAGE: Duration = Duration::from_secs(8);

/// How long the provider answers late before the storm, at most: the
/// workers hold their jobs meanwhile.
const SLOW_PROVIDER: Duration = Duration::from_secs(2);

/// How late it answers then: within the workers' 2 s timeout, so the
/// refunds are made and answered, only after the coordinators are gone.
const SLOW_ANSWER_MS: u64 = 1000;

/// How long the storm's reconciles may take to drain before the report
/// says they did not.
const DRAIN_PATIENCE: Duration = Duration::from_secs(60);

/// One failure that happened: what, what to try next, and when it lasted
/// (wall clock), for counting the calls workers saw fail meanwhile.
pub(super) struct Happened {
    pub what: String,
    pub next: Option<Chaos>,
    pub window: Option<(SystemTime, SystemTime)>,
    /// Set by the end of the takeover storm: its own line of the report
    /// (not one of the failures injected).
    pub storm: Option<Storm>,
}

fn happened(what: String, next: Option<Chaos>) -> Option<Happened> {
    Some(Happened {
        what,
        next,
        window: None,
        storm: None,
    })
}

/// Jobs running now, in every database.
async fn running(pools: &[MySqlPool]) -> Result<usize> {
    let mut n = 0;
    for pool in pools {
        let c: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'running'")
            .fetch_one(pool)
            .await?;
        n += c as usize;
    }
    Ok(n)
}

/// (id, attempt) of the jobs running with an expired lease (database
/// clock), in every database.
async fn expired_leases(pools: &[MySqlPool]) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for pool in pools {
        let rows = sqlx::query(
            "SELECT id, attempt FROM jobs WHERE state = 'running' AND lease_until <= UTC_TIMESTAMP(6)",
        )
        .fetch_all(pool)
        .await?;
        for r in rows {
            out.push((r.try_get("id")?, r.try_get("attempt")?));
        }
    }
    Ok(out)
}

/// Of the storm's expired leases: how many were taken over (a later
/// attempt), and how many are still running under the expired attempt or
/// under the takeover's (its reconcile not yet written back).
async fn storm_progress(pools: &[MySqlPool], expired: &[(u64, u64)]) -> Result<(usize, usize)> {
    let (mut taken_over, mut pending) = (0, 0);
    for (id, attempt) in expired {
        let row =
            sqlx::query("SELECT attempt, state = 'running' AS running FROM jobs WHERE id = ?")
                .bind(id)
                .fetch_one(pool_of(pools, *id))
                .await?;
        let now: u64 = row.try_get("attempt")?;
        let running: i64 = row.try_get("running")?;
        if now > *attempt {
            taken_over += 1;
        }
        if running != 0 && now <= attempt + 1 {
            pending += 1;
        }
    }
    Ok((taken_over, pending))
}

/// How long the storm's reconciles took, by the database clock, over the
/// jobs that were taken over: from the first takeover to the last one (the
/// hand-outs), and to the last event a takeover's attempt wrote (its
/// reconcile's Complete or Fail).
async fn storm_span(
    pools: &[MySqlPool],
    expired: &[(u64, u64)],
) -> Result<Option<(Duration, Duration)>> {
    let (mut first, mut last_taken, mut last): (Option<i64>, Option<i64>, Option<i64>) =
        (None, None, None);
    for (id, attempt) in expired {
        let row = sqlx::query(
            "SELECT CAST(UNIX_TIMESTAMP(MIN(IF(kind = 'taken_over', created_at, NULL))) * 1000000 AS SIGNED) AS taken, \
             CAST(UNIX_TIMESTAMP(MAX(created_at)) * 1000000 AS SIGNED) AS done \
             FROM job_events WHERE job_id = ? AND attempt = ?",
        )
        .bind(id)
        .bind(attempt + 1)
        .fetch_one(pool_of(pools, *id))
        .await?;
        let taken: Option<i64> = row.try_get("taken")?;
        let done: Option<i64> = row.try_get("done")?;
        if let (Some(t), Some(d)) = (taken, done) {
            first = Some(first.map_or(t, |f| f.min(t)));
            last_taken = Some(last_taken.map_or(t, |l| l.max(t)));
            last = Some(last.map_or(d, |l| l.max(d)));
        }
    }
    let since = |f: i64, t: i64| Duration::from_micros(t.saturating_sub(f).max(0) as u64);
    Ok(match (first, last_taken, last) {
        (Some(f), Some(t), Some(l)) => Some((since(f, t), since(f, l))),
        _ => None,
    })
}

/// What comes after the storm: the next disturbance of the coordinators
/// (the schedule goes on as before it), if any.
fn after_storm(cluster: &Cluster, elapsed: Duration) -> Option<Chaos> {
    if !cluster.coordinators.balanced() {
        None
    } else if cluster.galera.is_some() {
        Some(Chaos::KillNode(elapsed + GAP))
    } else {
        Some(Chaos::KillCoordinator(elapsed + GAP))
    }
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
    let shard = jobfence_store::shards::shard_of(id) as usize;
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
    match step {
        Chaos::Pause if elapsed >= Duration::from_secs(1) => freeze_worker(cluster, pool).await,
        Chaos::Resume(held) => resume_worker(cluster, pool, held).await,
        Chaos::Kill if cluster.workers.len() > 1 && elapsed >= Duration::from_millis(1500) => {
            kill_worker(cluster, pool).await
        }
        Chaos::Kill if cluster.workers.len() <= 1 => {
            Ok(happened("no second worker to kill".to_owned(), None))
        }
        Chaos::Kill => Ok(None),
        Chaos::Restart if elapsed >= Duration::from_secs(2) => {
            restart_coordinator(cluster, elapsed).await
        }
        Chaos::RollingRestart if elapsed >= Duration::from_secs(2) => {
            rolling_restart(cluster, elapsed).await
        }
        Chaos::KillCoordinator(after) if elapsed >= after => {
            kill_coordinator(cluster, elapsed).await
        }
        Chaos::DatabaseOutage(after) if elapsed >= after => database_outage(cluster).await,
        Chaos::KillNode(after) if elapsed >= after => kill_node(cluster, elapsed).await,
        Chaos::Storm(after) if elapsed >= after => storm(cluster, pool).await,
        Chaos::StormDrain(watch) => storm_drain(cluster, pool, watch, elapsed).await,
        Chaos::Pause
        | Chaos::KillNode(_)
        | Chaos::Restart
        | Chaos::RollingRestart
        | Chaos::KillCoordinator(_)
        | Chaos::DatabaseOutage(_)
        | Chaos::Storm(_) => Ok(None),
    }
}

/// Freezes the first worker (SIGSTOP) while it holds jobs; it is resumed once they were taken over.
async fn freeze_worker(cluster: &mut Cluster, pool: &[MySqlPool]) -> Result<Option<Happened>> {
    let name = cluster.workers[0].name.clone();
    let held = super::report::observe("the jobs a worker holds", || held_by(pool, &name)).await?;
    if held.is_empty() {
        return Ok(None);
    }
    cluster.workers[0].pause()?;
    cluster
        .frozen
        .push(super::worker_logs::Frozen::from_now(&name));
    Ok(happened(
        format!("{name} frozen (SIGSTOP) holding {} jobs", held.len()),
        Some(Chaos::Resume(held)),
    ))
}

/// Resumes the frozen worker once some of its jobs were taken over (the zombie wakes up).
async fn resume_worker(
    cluster: &mut Cluster,
    pool: &[MySqlPool],
    held: Vec<(u64, u64)>,
) -> Result<Option<Happened>> {
    let Some(superseded) = super::report::observe("whether held jobs were taken over", || {
        taken_over(pool, &held)
    })
    .await?
    else {
        return Ok(None);
    };
    cluster.workers[0].resume()?;
    super::worker_logs::Frozen::resumed_now(&mut cluster.frozen);
    let name = &cluster.workers[0].name;
    if superseded == 0 {
        // Its writes were already on their way: no zombie yet.
        // Freeze it again later, so one really is.
        return Ok(happened(
            format!("{name} resumed: it had finished its jobs; freezing it again"),
            Some(Chaos::Pause),
        ));
    }
    Ok(happened(
        format!("{name} resumed after {superseded} of its jobs were taken over"),
        None,
    ))
}

/// Kills the second worker mid-request (SIGKILL) and starts a replacement on its queue.
async fn kill_worker(cluster: &mut Cluster, pool: &[MySqlPool]) -> Result<Option<Happened>> {
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
    cluster.workers[1] =
        cluster.rust_worker_on(&format!("{name}-restarted"), cluster.concurrency, &queue)?;
    Ok(happened(
        format!("{name} killed mid-request (SIGKILL), replaced"),
        None,
    ))
}

/// Restarts the only coordinator (SIGTERM, start).
async fn restart_coordinator(cluster: &mut Cluster, elapsed: Duration) -> Result<Option<Happened>> {
    let from = SystemTime::now();
    let took = Instant::now();
    cluster.coordinators.restart(0).await?;
    Ok(Some(Happened {
        what: "coordinator restarted (SIGTERM, start)".to_owned(),
        next: Some(Chaos::Storm(elapsed + took.elapsed() + GAP)),
        window: Some((from, SystemTime::now())),
        storm: None,
    }))
}

/// Restarts every coordinator in turn (SIGTERM, drain, start).
async fn rolling_restart(cluster: &mut Cluster, elapsed: Duration) -> Result<Option<Happened>> {
    let from = SystemTime::now();
    let took = std::time::Instant::now();
    let mut stops = Vec::new();
    for i in 0..cluster.coordinators.list.len() {
        let took = cluster.coordinators.restart(i).await?;
        stops.push(format!("{:.1}", took.as_secs_f64()));
    }
    Ok(Some(Happened {
        what: format!(
            "rolling restart of {} coordinators (SIGTERM, drain, start; stopped in {} s)",
            stops.len(),
            stops.join(" / ")
        ),
        next: Some(Chaos::Storm(elapsed + took.elapsed() + GAP)),
        window: Some((from, SystemTime::now())),
        storm: None,
    }))
}

/// Kills the last coordinator (SIGKILL) and restarts it; HAProxy takes it out.
async fn kill_coordinator(cluster: &mut Cluster, elapsed: Duration) -> Result<Option<Happened>> {
    let from = SystemTime::now();
    let took = std::time::Instant::now();
    let last = cluster.coordinators.list.len() - 1;
    let name = cluster.coordinators.list[last].name.clone();
    let noticed = cluster.coordinators.kill(last).await?;
    Ok(Some(Happened {
        what: format!(
            "{name} killed (SIGKILL), restarted; HAProxy took it out after {}",
            noticed.map_or("(not seen)".to_owned(), |d| format!("{} ms", d.as_millis()))
        ),
        next: Some(Chaos::DatabaseOutage(elapsed + took.elapsed() + GAP)),
        window: Some((from, SystemTime::now())),
        storm: None,
    }))
}

/// Cuts the coordinators off the database for [`OUTAGE`].
async fn database_outage(cluster: &mut Cluster) -> Result<Option<Happened>> {
    let from = SystemTime::now();
    let (down, up) = cluster.coordinators.database_outage(OUTAGE).await?;
    Ok(Some(Happened {
        what: format!(
            "database unreachable for {} s (connections cut): NOT_SERVING after {} ms, \
         SERVING again {} ms after it was back",
            OUTAGE.as_secs(),
            down.as_millis(),
            up.as_millis()
        ),
        next: None,
        window: Some((from, SystemTime::now())),
        storm: None,
    }))
}

/// Kills the Galera node the coordinators write through (SIGKILL), and restarts it in the background.
async fn kill_node(cluster: &mut Cluster, elapsed: Duration) -> Result<Option<Happened>> {
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
    let unknown =
        unknown_commits(&cluster.coordinators.scrape().await).saturating_sub(unknown_before);
    cluster.node_restart = Some(
        tokio::process::Command::new(&script)
            .args(["restart", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?,
    );
    Ok(Some(Happened {
        what: format!(
            "Galera node 1 killed (SIGKILL) under load: every coordinator on node 2 after {}; \
         commits answered COMMIT_OUTCOME_UNKNOWN: {unknown}; node 1 restarting",
            moved.map_or("(not seen in 30 s)".to_owned(), |d| format!(
                "{} ms",
                d.as_millis()
            ))
        ),
        // Alone, the coordinator meets the storm after the node.
        next: Some(if cluster.coordinators.list.len() > 1 {
            Chaos::KillCoordinator(elapsed + killed.elapsed() + GAP)
        } else {
            Chaos::Storm(elapsed + killed.elapsed() + GAP)
        }),
        window: Some((from, SystemTime::now())),
        storm: None,
    }))
}

/// The takeover storm: the provider slowed until the workers hold many jobs, then every coordinator killed for twice the lease.
async fn storm(cluster: &mut Cluster, pool: &[MySqlPool]) -> Result<Option<Happened>> {
    // The provider answers late for a moment, as real providers do
    // under load: every call the workers make meanwhile keeps its
    // job in their hands, so the coordinators go down while the
    // workers hold many jobs (half their slots, or what they hold
    // after SLOW_PROVIDER).
    let faults = cluster.provider_client.faults().await?;
    cluster
        .provider_client
        .set_faults(&FaultConfig {
            latency: 1.0,
            latency_ms: SLOW_ANSWER_MS,
            ..faults
        })
        .await?;
    let slow = Instant::now();
    let held = loop {
        let held = super::report::observe("the jobs workers hold", || running(pool)).await?;
        if held * 2 >= cluster.slots || slow.elapsed() >= SLOW_PROVIDER {
            break held;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let from = SystemTime::now();
    let killed = Instant::now();
    // SIGKILL, not SIGTERM: a draining coordinator would let the
    // workers write back what they hold; nor SIGSTOP: the calls
    // queued in a frozen process would be served when it resumes,
    // racing the takeovers.
    cluster.coordinators.kill_all().await?;
    cluster.provider_client.set_faults(&faults).await?;
    // Twice the lease: every lease held at the kill has expired
    // well before they are back, and refunds keep arriving.
    let down = cluster.lease * 2;
    tokio::time::sleep(down.saturating_sub(killed.elapsed())).await;
    let expired = super::report::observe("the expired leases", || expired_leases(pool)).await?;
    let stopped = killed.elapsed();
    cluster.coordinators.start_all().await?;
    Ok(Some(Happened {
        what: format!(
            "takeover storm: every coordinator killed (SIGKILL) while the workers held \
         {held} jobs (the provider answering {} s late), started again after {:.1} s \
         (lease {}) with {} leases expired",
            SLOW_ANSWER_MS as f64 / 1000.0,
            stopped.as_secs_f64(),
            humantime::format_duration(cluster.lease),
            expired.len()
        ),
        next: Some(Chaos::StormDrain(StormWatch {
            expired,
            back: Instant::now(),
        })),
        window: Some((from, SystemTime::now())),
        storm: None,
    }))
}

/// Watches the storm's expired leases until they were taken over (or for [`DRAIN_PATIENCE`]), then reports it.
async fn storm_drain(
    cluster: &mut Cluster,
    pool: &[MySqlPool],
    watch: StormWatch,
    elapsed: Duration,
) -> Result<Option<Happened>> {
    let (taken_over, pending) = super::report::observe("the storm's takeovers", || {
        storm_progress(pool, &watch.expired)
    })
    .await?;
    let waited = watch.back.elapsed();
    if pending > 0 && waited < DRAIN_PATIENCE {
        return Ok(None);
    }
    let span = if pending == 0 {
        super::report::observe("the storm's events", || storm_span(pool, &watch.expired)).await?
    } else {
        None
    };
    let storm = Storm {
        expired: watch.expired.len(),
        taken_over,
        handed_out: span.map(|s| s.0),
        drained: span.map(|s| s.1),
    };
    Ok(Some(Happened {
        what: format!(
            "takeover storm over: {taken_over} of {} expired leases taken over{}",
            storm.expired,
            match (storm.drained, pending) {
                (Some(d), _) => format!(", their reconciles drained in {:.1} s", d.as_secs_f64()),
                (None, 0) => String::new(),
                (None, _) => format!(
                    ", {pending} still running after {}",
                    humantime::format_duration(DRAIN_PATIENCE)
                ),
            }
        ),
        next: after_storm(cluster, elapsed),
        window: None,
        storm: Some(storm),
    }))
}
