//! Workers, seen across coordinators (docs/operating.md "Workers"): which
//! worker_ids called in the last minutes, with what client, through which
//! coordinator, how often, and which jobs each holds now.
//!
//! How it is kept:
//! - On a call that names a worker (Claim, Takeover, a Complete or Fail
//!   asking for its next job), the gRPC layer tells [`Sightings::saw`]: a
//!   map update under a mutex, no I/O. That is all a call pays.
//! - Every few seconds ([`Coordinator::spawn_worker_sightings`]) the
//!   coordinator writes the workers it saw lately into `worker_sightings`
//!   of the first database, one row per worker and coordinator, in one
//!   statement ([`JobStore::record_sightings`]).
//! - [`Coordinator::workers`] reads every coordinator's rows, merges them
//!   per worker, and adds the running jobs each holds (from the jobs
//!   table of every database, so a lease is always the database's word).

use super::Coordinator;
use jobfence_domain::validate::Violations;
use jobfence_domain::CoordinatorError;
use jobfence_store::workers::{HeldJob, Sighting};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often each coordinator writes what it saw.
pub const SIGHTINGS_INTERVAL: Duration = Duration::from_secs(5);

/// A worker whose last call is older than this, and whose leases all
/// ended, is shown stale (the default of `ListWorkers.stale_after`).
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(60);

/// How far back a listing looks by default.
pub const DEFAULT_WITHIN: Duration = Duration::from_secs(15 * 60);

/// Width of one bucket of the calls-per-minute count.
const BUCKET: Duration = Duration::from_secs(5);
const BUCKETS: usize = 12;

/// A worker in memory, as this coordinator saw it.
#[derive(Debug)]
struct Seen {
    client: String,
    queue: String,
    first: Instant,
    last: Instant,
    /// Calls per [`BUCKET`], with the bucket's number since `origin`.
    calls: [(u64, u32); BUCKETS],
}

/// What one coordinator saw of its workers since it started; see the
/// module documentation.
#[derive(Debug)]
pub struct Sightings {
    name: String,
    origin: Instant,
    seen: Mutex<HashMap<String, Seen>>,
}

impl Sightings {
    /// An empty record for the coordinator called `name`.
    pub fn new(name: String) -> Self {
        Sightings {
            name,
            origin: Instant::now(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn bucket(&self, at: Instant) -> u64 {
        (at.duration_since(self.origin).as_millis() / BUCKET.as_millis()) as u64
    }

    /// A call from `worker_id` on `queue`, made with `client` (the
    /// user-agent's first word). A worker_id or a queue the coordinator
    /// refuses (empty, too long, a queue name with other characters) is
    /// not kept: the call is refused, and its row could not be written.
    pub fn saw(&self, worker_id: &str, queue: &str, client: &str) {
        let mut v = Violations::default();
        v.key("worker_id", worker_id);
        if !queue.is_empty() {
            v.queue("queue", queue);
        }
        if v.finish().is_err() {
            return;
        }
        let now = Instant::now();
        let bucket = self.bucket(now);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let w = seen.entry(worker_id.to_owned()).or_insert_with(|| Seen {
            client: client.to_owned(),
            queue: queue.to_owned(),
            first: now,
            last: now,
            calls: [(0, 0); BUCKETS],
        });
        w.last = now;
        if w.client != client {
            client.clone_into(&mut w.client);
        }
        // A Takeover names no queue: the last one named stays.
        if !queue.is_empty() && w.queue != queue {
            queue.clone_into(&mut w.queue);
        }
        let slot = &mut w.calls[(bucket % BUCKETS as u64) as usize];
        if slot.0 != bucket {
            *slot = (bucket, 0);
        }
        slot.1 = slot.1.saturating_add(1);
    }

    /// The workers that called in the last minute and a little more (so a
    /// worker that stopped is written once more with its count fallen),
    /// as rows; workers silent longer are forgotten here (their rows stay
    /// in the table).
    fn recent(&self) -> Vec<Sighting> {
        let now = Instant::now();
        let bucket = self.bucket(now);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|_, w| now.duration_since(w.last) <= 2 * DEFAULT_STALE_AFTER);
        seen.iter()
            .filter(|(_, w)| now.duration_since(w.last) <= DEFAULT_STALE_AFTER + 2 * BUCKET)
            .map(|(id, w)| Sighting {
                worker_id: id.clone(),
                coordinator: self.name.clone(),
                client: w.client.clone(),
                queue: w.queue.clone(),
                first_seen_ago: now.duration_since(w.first),
                last_call_ago: now.duration_since(w.last),
                calls_last_minute: w
                    .calls
                    .iter()
                    .filter(|(b, _)| bucket.saturating_sub(*b) < BUCKETS as u64)
                    .map(|(_, n)| n)
                    .sum(),
            })
            .collect()
    }
}

/// One worker, merged over the coordinators that saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerView {
    pub worker_id: String,
    /// The client and version of its latest call.
    pub client: String,
    /// The coordinator that served its latest call.
    pub coordinator: String,
    /// The queue of its latest call.
    pub queue: String,
    pub first_seen_ago: Duration,
    pub last_call_ago: Duration,
    /// Calls in the last minute, summed over coordinators (0 once its last
    /// call is a minute old).
    pub calls_per_minute: u32,
    /// The running jobs whose lease it holds, by job id.
    pub held: Vec<HeldJob>,
    /// It called within `stale_after`, or holds a lease that has not
    /// ended (a long handler renews its lease without naming itself).
    pub live: bool,
}

impl Coordinator {
    /// What this coordinator saw of its workers (the gRPC layer records
    /// into it).
    pub fn sightings(&self) -> &Sightings {
        &self.pipelines.sightings
    }

    /// Writes what this coordinator saw lately (see the module
    /// documentation); how many workers it wrote.
    pub async fn write_sightings(&self) -> Result<usize, CoordinatorError> {
        let recent = self.sightings().recent();
        self.store().record_sightings(&recent).await?;
        Ok(recent.len())
    }

    /// The workers whose last call is at most `within` old, by
    /// worker_id, each with the jobs it holds; stale past `stale_after`
    /// (see [`WorkerView::live`]). `InvalidArgument` for a zero `within`.
    pub async fn workers(
        &self,
        stale_after: Duration,
        within: Duration,
    ) -> Result<Vec<WorkerView>, CoordinatorError> {
        let mut v = Violations::default();
        if within.is_zero() {
            v.add("within", "must be more than zero");
        }
        v.delay("within", within);
        v.delay("stale_after", stale_after);
        v.finish()?;
        let sightings = self.store().sightings(within).await?;
        let mut by_worker: BTreeMap<String, WorkerView> = BTreeMap::new();
        for s in sightings {
            let recent = s.last_call_ago <= DEFAULT_STALE_AFTER;
            let calls = if recent { s.calls_last_minute } else { 0 };
            match by_worker.get_mut(&s.worker_id) {
                // Rows come latest call first: the first is the view's.
                Some(w) => {
                    w.calls_per_minute = w.calls_per_minute.saturating_add(calls);
                    w.first_seen_ago = w.first_seen_ago.max(s.first_seen_ago);
                }
                None => {
                    let view = WorkerView {
                        worker_id: s.worker_id.clone(),
                        client: s.client,
                        coordinator: s.coordinator,
                        queue: s.queue,
                        first_seen_ago: s.first_seen_ago,
                        last_call_ago: s.last_call_ago,
                        calls_per_minute: calls,
                        held: Vec::new(),
                        live: false,
                    };
                    by_worker.insert(s.worker_id, view);
                }
            }
        }
        self.add_held_jobs(&mut by_worker).await?;
        Ok(by_worker
            .into_values()
            .map(|mut w| {
                w.live =
                    w.last_call_ago <= stale_after || w.held.iter().any(|j| j.lease_left_us > 0);
                w
            })
            .collect())
    }

    /// The running jobs of every database, given to the worker holding
    /// each lease (whatever queue it called about last).
    async fn add_held_jobs(
        &self,
        by_worker: &mut BTreeMap<String, WorkerView>,
    ) -> Result<(), CoordinatorError> {
        for (_, store) in self.shards.all() {
            for job in store.held_jobs().await? {
                if let Some(w) = by_worker.get_mut(&job.worker_id) {
                    w.held.push(job);
                }
            }
        }
        Ok(())
    }

    /// Writes the sightings every [`SIGHTINGS_INTERVAL`] and sets the
    /// workers gauges from the merged view, until the handle is aborted.
    pub fn spawn_worker_sightings(&self) -> tokio::task::JoinHandle<()> {
        let coordinator = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SIGHTINGS_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = coordinator.write_sightings().await {
                    tracing::warn!(error = %e, "could not write the workers seen");
                    continue;
                }
                match coordinator
                    .workers(DEFAULT_STALE_AFTER, DEFAULT_WITHIN)
                    .await
                {
                    Ok(all) => {
                        let live = all.iter().filter(|w| w.live).count();
                        coordinator.metrics.set_workers(live, all.len() - live);
                    }
                    Err(e) => tracing::warn!(error = %e, "could not read the workers seen"),
                }
            }
        })
    }
}

/// The client of a call from its `user-agent`: the first word naming a
/// jobfence client (`jobfence-python/0.1.0`), else the first word
/// (`grpc-go/1.59.0`, `tonic/0.14`), else `unknown`.
pub fn client_of(user_agent: Option<&str>) -> String {
    let ua = user_agent.unwrap_or("");
    let words = || ua.split_whitespace();
    words()
        .find(|w| w.starts_with("jobfence-"))
        .or_else(|| words().next())
        .map(|w| w.chars().take(64).collect())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_counted_per_call_and_named_by_its_client() {
        let s = Sightings::new("c-1".into());
        s.saw("w-1", "refunds", "jobfence-python/0.1.0");
        s.saw("w-1", "refunds", "jobfence-python/0.1.0");
        s.saw("w-2", "payouts", "grpc-go/1.59.0");
        s.saw("", "refunds", "x");
        s.saw("w-3", "bad queue é", "x");
        s.saw(&"w".repeat(300), "refunds", "x");
        let mut rows = s.recent();
        rows.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].worker_id, "w-1");
        assert_eq!(rows[0].calls_last_minute, 2);
        assert_eq!(rows[0].coordinator, "c-1");
        assert_eq!(rows[1].queue, "payouts");
        assert_eq!(rows[1].calls_last_minute, 1);
    }

    #[test]
    fn the_client_is_the_jobfence_word_of_the_user_agent() {
        let ua = "grpc-python/1.60.0 jobfence-python/0.1.0 grpc-c/37.0.0 (linux; chttp2)";
        assert_eq!(client_of(Some(ua)), "jobfence-python/0.1.0");
        assert_eq!(client_of(Some("grpc-go/1.59.0")), "grpc-go/1.59.0");
        assert_eq!(client_of(None), "unknown");
    }
}
