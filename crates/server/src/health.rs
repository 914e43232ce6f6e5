//! The server's view of its databases: health (SERVING only while every
//! database answers, each through a node that is ready) and durability
//! (docs/design.md rule 9), followed on an interval, told to the gRPC health
//! service and mirrored for `GET /healthz`.

use crate::grpc::{JobAdminService, JobCoordinatorService, JobEventsService};
use crate::{OpsOptions, ServeOptions};
use jobfence_api::v1::job_admin_server::JobAdminServer;
use jobfence_api::v1::job_coordinator_server::JobCoordinatorServer;
use jobfence_api::v1::job_events_server::JobEventsServer;
use jobfence_core::Coordinator;
use jobfence_domain::durability::{self, Durability};
use jobfence_domain::CoordinatorError;
use jobfence_metrics::Metrics;
use jobfence_store::shards::Shards;
use jobfence_store::HealthProbe;
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tonic::server::NamedService;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The health service names we report: "" (the whole server) and each
/// jobfence service (all of them need the database).
const HEALTH_NAMES: [&str; 4] = [
    "",
    <JobCoordinatorServer<JobCoordinatorService> as NamedService>::NAME,
    <JobAdminServer<JobAdminService> as NamedService>::NAME,
    <JobEventsServer<JobEventsService> as NamedService>::NAME,
];

/// The serving status, told to the gRPC health service (the source of
/// truth) and mirrored for `GET /healthz` on the metrics listener.
#[derive(Clone)]
pub(crate) struct Health {
    pub(crate) reporter: HealthReporter,
    pub(crate) mirror: watch::Sender<ServingStatus>,
}

impl Health {
    pub(crate) async fn set(&self, status: ServingStatus) {
        for name in HEALTH_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
        self.mirror.send_replace(status);
    }
}

/// The database's durability as last read: the verdict on its settings, or
/// why they could not be read though the database answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurabilityView {
    Read(Durability),
    Unreadable(String),
}

/// Follows the databases: health (SERVING only while every one answers,
/// each through a node that is ready: see `store::health`) and durability
/// (docs/design.md rule 9), read at every check because a database can come
/// back, or be changed with `SET GLOBAL`, between two checks.
pub(crate) struct DatabaseFollower {
    pub(crate) health: Health,
    pub(crate) shards: Shards,
    /// One per database, indexed like `Shards::all`.
    pub(crate) probes: Vec<HealthProbe>,
    /// Longest a check may take before the database counts as gone.
    pub(crate) timeout: Duration,
    pub(crate) metrics: Metrics,
    pub(crate) require_durable: bool,
    /// See [`OpsOptions::check_shard_numbers`]; false once checked.
    pub(crate) check_shard_numbers: bool,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) status: Option<ServingStatus>,
    pub(crate) durability: Option<DurabilityView>,
}

/// A running [`DatabaseFollower`]: its task, and where its refusal to
/// serve arrives.
pub(crate) struct Watcher {
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) refused: oneshot::Receiver<anyhow::Error>,
}

impl DatabaseFollower {
    /// A follower of `coordinator`'s databases, reporting to `health`,
    /// until `stop`.
    pub(crate) fn new(
        coordinator: &Coordinator,
        health: Health,
        options: &ServeOptions,
        ops: &OpsOptions,
        stop: watch::Receiver<bool>,
    ) -> DatabaseFollower {
        let shards = coordinator.shards().clone();
        DatabaseFollower {
            health,
            probes: shards.all().iter().map(|(_, s)| s.health_probe()).collect(),
            shards,
            timeout: options.health_timeout.min(options.health_interval),
            metrics: coordinator.metrics().clone(),
            require_durable: ops.require_durable_database,
            check_shard_numbers: ops.check_shard_numbers,
            stop,
            status: None,
            durability: None,
        }
    }

    /// Starts following, checking every health interval. With
    /// `require_durable` the first check runs now, before the first RPC is
    /// accepted, and its refusal is returned (a database that does not
    /// answer yet is decided on when it does, at the next checks).
    pub(crate) async fn start(
        mut self,
        options: &ServeOptions,
        require_durable: bool,
    ) -> anyhow::Result<Watcher> {
        if require_durable {
            self.tick().await?;
        }
        let (refused_tx, refused) = oneshot::channel();
        let task = tokio::spawn(self.run(options.health_interval, refused_tx));
        Ok(Watcher { task, refused })
    }

    /// One check. The durability is reported (logged, and set on the gauge)
    /// at start, whenever the database comes back, and whenever it changes.
    /// An error is a refusal to serve (with `require_durable`, or a database
    /// refused its shard number, see `check_shard_numbers`); health is then
    /// left NOT_SERVING.
    async fn tick(&mut self) -> anyhow::Result<()> {
        let mut checked = self.check_all().await;
        if *self.stop.borrow() {
            return Ok(());
        }
        if checked.is_ok() && self.check_shard_numbers {
            match self.shards.prepare().await {
                Ok(()) => self.check_shard_numbers = false,
                // A refusal (this database is another shard) stops the
                // coordinator; anything else (the node gone again, a lock
                // wait on the number's row while another coordinator
                // checks it too, a certification conflict) is checked
                // again at the next tick, NOT_SERVING until then.
                Err(refused @ CoordinatorError::InvalidArgument(_)) => {
                    return Err(anyhow::Error::new(refused).context(
                        "refusing to serve: checking the databases' schema and shard numbers",
                    ))
                }
                Err(other) => checked = Err(other.to_string()),
            }
        }
        let status = match &checked {
            Ok(_) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        };
        if let Ok(view) = checked.as_ref() {
            let came_back = self.status != Some(ServingStatus::Serving);
            if came_back || self.durability.as_ref() != Some(view) {
                self.durability = Some(view.clone());
                self.report(view)?;
            }
        }
        if self.status != Some(status) {
            if status == ServingStatus::Serving && self.status.is_some() {
                // Back from an outage: the batch pool's idle connections
                // died with it.
                for (_, store) in self.shards.all() {
                    store.renew_batch_connections();
                }
            }
            match &checked {
                Ok(_) => tracing::info!(status = %status, "database health changed"),
                Err(why) => {
                    tracing::warn!(status = %status, error = %why, "database health changed")
                }
            }
            self.health.set(status).await;
            self.status = Some(status);
        }
        Ok(())
    }

    /// Checks every database; the first that does not answer decides the
    /// error. With several databases the verdict on durability lists the
    /// risks of all of them (the settings shown are the first one's).
    async fn check_all(&mut self) -> Result<DurabilityView, String> {
        let several = self.probes.len() > 1;
        let mut combined: Option<DurabilityView> = None;
        let mut down = None;
        for (probe, (n, _)) in self.probes.iter_mut().zip(self.shards.all()) {
            let view = match probe.check(self.timeout).await {
                Ok(settings) => DurabilityView::Read(durability::assess(settings)),
                Err(CoordinatorError::DatabaseUnavailable(why)) => {
                    let why = if several {
                        format!("database {n}: {why}")
                    } else {
                        why
                    };
                    down.get_or_insert(why);
                    continue;
                }
                Err(other) => DurabilityView::Unreadable(other.to_string()),
            };
            combined = Some(match (combined, view) {
                (None, v) => v,
                (Some(DurabilityView::Read(mut a)), DurabilityView::Read(b)) => {
                    a.risks.extend(b.risks);
                    DurabilityView::Read(a)
                }
                (Some(u @ DurabilityView::Unreadable(_)), _)
                | (_, u @ DurabilityView::Unreadable(_)) => u,
            });
        }
        match (down, combined) {
            (Some(why), _) => Err(why),
            (None, Some(view)) => Ok(view),
            (None, None) => Err("no database".to_owned()),
        }
    }

    fn report(&self, view: &DurabilityView) -> anyhow::Result<()> {
        let risks = match view {
            DurabilityView::Read(d) if d.is_durable() => {
                self.metrics.set_database_durable(true);
                tracing::info!(settings = %d.summary(), "database commits durably");
                return Ok(());
            }
            DurabilityView::Read(d) => {
                for r in &d.risks {
                    tracing::warn!(
                        setting = r.setting,
                        value = %r.value,
                        risk = %r.risk,
                        "database setting can lose an acknowledged commit, and a claim could then hand out the same attempt twice"
                    );
                }
                let risks: Vec<String> = d.risks.iter().map(|r| r.to_string()).collect();
                risks.join("; ")
            }
            DurabilityView::Unreadable(why) => {
                tracing::warn!(
                    error = %why,
                    "database durability settings could not be read; an acknowledged commit may be lost"
                );
                format!("its durability settings could not be read ({why})")
            }
        };
        self.metrics.set_database_durable(false);
        if self.require_durable {
            anyhow::bail!(
                "refusing to serve (--require-durable-database): the database can lose an \
                 acknowledged commit, after which a claim could hand out the same attempt \
                 twice (docs/design.md rule 9): {risks}"
            );
        }
        Ok(())
    }

    /// Checks every `interval` until stopped, or until a refusal, which is
    /// sent on `refused`.
    async fn run(mut self, interval: Duration, refused: oneshot::Sender<anyhow::Error>) {
        loop {
            if let Err(why) = self.tick().await {
                let _ = refused.send(why);
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = self.stop.changed() => return,
            }
        }
    }
}
