//! Rolling upgrades with no SQL by hand (docs/operating.md "Upgrading",
//! docs/releases.md): every few seconds each coordinator writes its
//! heartbeat into each database and looks for coordinators of an older
//! release. While one may be alive it keeps the older behaviour where the
//! two would disagree (today: a claim reads the observations of every job
//! it hands out, whatever `jobs.has_observations` says, since a
//! coordinator of 0.1.0 records observations without setting it). Once
//! no coordinator has seen one for the quiet period (the transition's
//! `opened_at`, moved at every sighting), the newest coordinator runs the
//! transition's backfill, once (the transition's row lock decides), and
//! every coordinator trusts the flag again. A coordinator that starts
//! while no coordinator of the transition's release runs reopens it: an
//! older one may have run while none watched.
//!
//! An older coordinator is seen by its heartbeat (0.2.0 and later), or, for
//! a release that writes none, by its database sessions: a session of the
//! coordinators' user that no jobfence process of 0.2.0 or later
//! registered (`jobfence_store::fleet`). The latter errs on the safe side:
//! an operator's `mysql` shell logged in as the coordinators' user also
//! keeps the older behaviour while it is connected.

use super::Coordinator;
use jobfence_store::fleet::{
    older_release, set_observations_flag_complete, Backfill, FleetView, Heartbeat,
    OBSERVATIONS_FLAG, REGISTRATION_GRACE,
};
use jobfence_store::schema::{schema_version, RELEASE};
use jobfence_store::JobStore;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The default quiet period (`serve --upgrade-quiet-period`): how long no
/// older coordinator may be seen before a transition's backfill runs.
pub const DEFAULT_QUIET_PERIOD: Duration = Duration::from_secs(60);

/// The longest one database's check may take; past it the flag is not
/// trusted until a check finishes.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the fleet is checked: a quarter of the quiet period, between
/// 250 ms and 5 s.
pub fn check_interval(quiet: Duration) -> Duration {
    (quiet / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
}

/// What one database's checks remember between ticks.
#[derive(Debug, Default)]
struct DatabaseFleet {
    /// What was said of the older coordinators last, and when.
    said: String,
    said_at: Option<Instant>,
    /// Since when each unregistered session was seen unregistered: one
    /// counts once that is longer than the registrar's grace.
    unregistered_since: HashMap<u64, Instant>,
    /// This database's first check: until the registrar's grace has
    /// passed since, an older coordinator's sessions cannot be told yet,
    /// so nothing counts as clear.
    first_check: Option<Instant>,
    /// Whether the first check looked for a gap (no coordinator of the
    /// transition's release watching before this one started), and
    /// whether one is still to be brought forward.
    gap_checked: bool,
    gap: bool,
}

/// What one database's check found: whether the flag may be trusted
/// there, how many older coordinators (or unregistered sessions) count,
/// and each transition with whether it is open.
type Checked = (bool, usize, Vec<(String, bool)>);

impl Coordinator {
    /// Checks the fleet of every database every [`check_interval`] until
    /// the handle is aborted (see the module documentation). Until its
    /// first check a coordinator reads observations regardless of the flag.
    pub fn spawn_fleet(&self, quiet: Duration) -> tokio::task::JoinHandle<()> {
        set_observations_flag_complete(false);
        self.metrics
            .set_fleet(0, &[(OBSERVATIONS_FLAG.to_owned(), true)]);
        let coordinator = self.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            let mut fleets: Vec<DatabaseFleet> = coordinator
                .shards
                .all()
                .iter()
                .map(|_| DatabaseFleet::default())
                .collect();
            let mut tick = tokio::time::interval(check_interval(quiet));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let beat = coordinator.heartbeat(started.elapsed());
                let mut complete = true;
                let mut older = 0;
                let mut open = Vec::new();
                for ((n, store), fleet) in coordinator.shards.all().iter().zip(&mut fleets) {
                    let checked = tokio::time::timeout(
                        CHECK_TIMEOUT,
                        coordinator.check_database(*n, store, fleet, &beat, quiet),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(jobfence_domain::CoordinatorError::DatabaseUnavailable(
                            "the check took longer than 10 s".into(),
                        ))
                    });
                    match checked {
                        Ok((done, seen, mut transitions)) => {
                            // Open while this coordinator keeps the older
                            // behaviour for it (its grace included).
                            if !done {
                                set_open(&mut transitions, true);
                            }
                            complete &= done;
                            older += seen;
                            open.extend(transitions);
                        }
                        Err(e) => {
                            complete = false;
                            // Nothing is known of the time it could not
                            // look: the grace starts again.
                            fleet.first_check = None;
                            tracing::warn!(database = n, error = %e, "could not check the coordinators of a database");
                        }
                    }
                }
                set_observations_flag_complete(complete);
                coordinator.metrics.set_fleet(older, &open);
            }
        })
    }

    fn heartbeat(&self, up: Duration) -> Heartbeat {
        Heartbeat {
            name: self.config.name.clone(),
            release: RELEASE.to_owned(),
            schema_version: schema_version(),
            host: crate::host_name(),
            up,
        }
    }

    /// One database's check (see the module documentation).
    async fn check_database(
        &self,
        n: u32,
        store: &JobStore,
        fleet: &mut DatabaseFleet,
        beat: &Heartbeat,
        quiet: Duration,
    ) -> Result<Checked, jobfence_domain::CoordinatorError> {
        let mut view = store.fleet_check(beat, quiet).await?;
        let now = Instant::now();
        let first_check = *fleet.first_check.get_or_insert(now);
        let since = &mut fleet.unregistered_since;
        since.retain(|id, _| view.unregistered.iter().any(|u| u.connection_id == *id));
        let before = view.unregistered.len();
        view.unregistered.retain(|u| {
            now.duration_since(*since.entry(u.connection_id).or_insert(now)) >= REGISTRATION_GRACE
        });
        let in_grace = before - view.unregistered.len();
        let mut transitions: Vec<(String, bool)> = view
            .transitions
            .iter()
            .map(|t| (t.name.clone(), !t.completed))
            .collect();
        let Some(flag) = view
            .transitions
            .iter()
            .find(|t| t.name == OBSERVATIONS_FLAG)
        else {
            return Ok((true, 0, transitions));
        };
        let older = older_ones(&view, &flag.release);
        say_older(n, fleet, &older);
        // No coordinator of the transition's release watched before this
        // one started (a first start, a restart of every coordinator, a
        // rollback and back): an older one may have run meanwhile. Decided
        // once the grace has passed: by then a running older one is seen.
        if !fleet.gap_checked {
            fleet.gap_checked = true;
            fleet.gap = !view
                .coordinators
                .iter()
                .any(|c| c.name != beat.name && !older_release(&c.release, &flag.release));
        }
        if !older.is_empty() {
            fleet.gap = false;
            if store.reopen_transition(OBSERVATIONS_FLAG).await? {
                tracing::warn!(database = n, older = %older.join("; "), "an older coordinator is seen after the observations flag was brought forward: claims read every job's observations until it is brought forward again");
            }
            set_open(&mut transitions, true);
            return Ok((false, older.len(), transitions));
        }
        if in_grace > 0 || now.duration_since(first_check) < REGISTRATION_GRACE {
            return Ok((false, 0, transitions));
        }
        if std::mem::take(&mut fleet.gap) {
            // Nothing older runs now; what one may have left is brought
            // forward at once.
            store.reopen_transition(OBSERVATIONS_FLAG).await?;
            return self
                .run_backfill(n, store, Duration::ZERO, transitions)
                .await;
        }
        if flag.completed {
            return Ok((true, 0, transitions));
        }
        let newest = view
            .coordinators
            .iter()
            .all(|c| !older_release(RELEASE, &c.release));
        if !newest {
            return Ok((false, 0, transitions));
        }
        self.run_backfill(n, store, quiet, transitions).await
    }

    /// The observations flag's backfill, once no coordinator has seen an
    /// older one for `quiet`.
    async fn run_backfill(
        &self,
        n: u32,
        store: &JobStore,
        quiet: Duration,
        mut transitions: Vec<(String, bool)>,
    ) -> Result<Checked, jobfence_domain::CoordinatorError> {
        match store
            .backfill(OBSERVATIONS_FLAG, &self.config.name, quiet)
            .await?
        {
            Backfill::NotQuietYet => return Ok((false, 0, transitions)),
            Backfill::Complete => {}
            Backfill::Ran(rows) => {
                self.metrics.backfilled(OBSERVATIONS_FLAG);
                tracing::info!(
                    database = n,
                    transition = OBSERVATIONS_FLAG,
                    rows,
                    quiet_period = %humantime::format_duration(quiet),
                    "backfill: no older coordinator seen for the quiet period; brought the observations flag forward"
                );
            }
        }
        set_open(&mut transitions, false);
        Ok((true, 0, transitions))
    }
}

/// Says which older coordinators are seen when that changes from none to
/// some and back, and once a minute while some are.
fn say_older(n: u32, fleet: &mut DatabaseFleet, older: &[String]) {
    let older = older.join("; ");
    let due = fleet
        .said_at
        .is_none_or(|at| at.elapsed() >= Duration::from_secs(60));
    if older.is_empty() != fleet.said.is_empty() || (!older.is_empty() && due) {
        if older.is_empty() {
            tracing::info!(
                database = n,
                "no coordinator of an older release is seen now"
            );
        } else {
            tracing::info!(database = n, older = %older, "coordinators of an older release may be running: keeping their behaviour (claims read every job's observations)");
        }
        fleet.said = older;
        fleet.said_at = Some(Instant::now());
    }
}

fn set_open(transitions: &mut [(String, bool)], open: bool) {
    for t in transitions.iter_mut().filter(|t| t.0 == OBSERVATIONS_FLAG) {
        t.1 = open;
    }
}

/// The coordinators `view` saw that are older than `release` (the
/// release a transition came with), a phrase each: by their heartbeat, or
/// a session no jobfence process of 0.2.0 or later registered.
fn older_ones(view: &FleetView, release: &str) -> Vec<String> {
    let by_heartbeat = view
        .coordinators
        .iter()
        .filter(|c| older_release(&c.release, release))
        .map(|c| format!("{} ({})", c.name, c.release));
    let by_session = view.unregistered.iter().map(|s| {
        format!(
            "a session from {} (connection {}) that no jobfence {RELEASE} registered",
            s.host, s.connection_id
        )
    });
    by_heartbeat.chain(by_session).collect()
}
