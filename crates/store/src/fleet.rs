//! The coordinators of one database, across releases (docs/operating.md
//! "Upgrading"): each writes a heartbeat with its release; each session of
//! a jobfence process registers itself when it connects; and the schema
//! transitions (data a newer release keeps differently) are brought
//! forward once no older coordinator is seen.
//!
//! Nothing here is on a call's path but [`observations_flag_complete`], an
//! atomic load.

pub(crate) mod sessions;

use super::{convert_sqlx_err, micros, JobStore};
use crate::run::transaction;
use jobfence_domain::CoordinatorError;
use sqlx::Row;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The transition of `jobs.has_observations` (migration 20261210000001;
/// docs/design.md rule 7): a coordinator of 0.1.0 records an observation
/// without setting the flag, so until its backfill a claim reads the
/// observations of every job it hands out.
pub const OBSERVATIONS_FLAG: &str = "observations_flag";

/// Whether this process may trust `jobs.has_observations` (the
/// [`OBSERVATIONS_FLAG`] transition is complete on every database it
/// serves, and no older coordinator is seen). True in a process that
/// never checks (tests, tools on a fresh schema); a coordinator turns it
/// off at start until its first check says otherwise.
static OBSERVATIONS_FLAG_COMPLETE: AtomicBool = AtomicBool::new(true);

/// See [`OBSERVATIONS_FLAG_COMPLETE`]: read by every claim and takeover.
pub(crate) fn observations_flag_complete() -> bool {
    OBSERVATIONS_FLAG_COMPLETE.load(Ordering::Relaxed)
}

/// Sets what [`observations_flag_complete`] answers (the fleet check, or
/// a coordinator's start).
pub fn set_observations_flag_complete(complete: bool) {
    OBSERVATIONS_FLAG_COMPLETE.store(complete, Ordering::Relaxed);
}

/// How often a store writes the registrations of its new sessions
/// (`sessions.rs`).
pub const REGISTRAR_INTERVAL: Duration = Duration::from_secs(1);

/// How long a session may go unregistered before a coordinator takes it
/// for an older coordinator's: the registrar's interval, and room for a
/// loaded machine.
pub const REGISTRATION_GRACE: Duration = Duration::from_secs(5);

/// A coordinator's heartbeat.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    /// Its `--coordinator-name`.
    pub name: String,
    /// Its release (semver).
    pub release: String,
    /// The newest migration it carries.
    pub schema_version: i64,
    pub host: String,
    /// Since it started.
    pub up: Duration,
}

/// A coordinator seen lately, by its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub name: String,
    pub release: String,
    pub schema_version: i64,
    /// Since its last heartbeat.
    pub ago: Duration,
}

/// A session of the coordinators' user that no jobfence process of 0.2.0
/// or newer registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unregistered {
    pub connection_id: u64,
    /// The client's `host:port`, as the server sees it.
    pub host: String,
}

/// A schema transition's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub name: String,
    /// The release whose coordinators keep the data the new way.
    pub release: String,
    pub completed: bool,
    /// How many backfills ran (again after a rollback).
    pub backfills: u32,
}

/// What one fleet check saw of a database.
#[derive(Debug, Clone, Default)]
pub struct FleetView {
    pub coordinators: Vec<Seen>,
    pub unregistered: Vec<Unregistered>,
    pub transitions: Vec<Transition>,
}

impl JobStore {
    /// Writes `beat`, forgets closed sessions' registrations, and reads
    /// the coordinators seen within `quiet`, the unregistered sessions and
    /// the transitions. Several statements, no transaction.
    ///
    /// Errors: `DatabaseUnavailable` when the database does not answer.
    pub async fn fleet_check(
        &self,
        beat: &Heartbeat,
        quiet: Duration,
    ) -> Result<FleetView, CoordinatorError> {
        let pool = self.pool();
        let up = micros(beat.up);
        self.retry_conflicts(|| async {
            sqlx::query(include_str!("queries/fleet/heartbeat.sql"))
                .bind(&beat.name)
                .bind(&beat.release)
                .bind(beat.schema_version)
                .bind(&beat.host)
                .bind(up)
                .execute(&pool)
                .await
                .map_err(convert_sqlx_err)?;
            sqlx::raw_sql(include_str!("queries/fleet/forget.sql"))
                .execute(&pool)
                .await
                .map_err(convert_sqlx_err)
        })
        .await?;
        let coordinators = sqlx::query(include_str!("queries/fleet/live.sql"))
            .bind(micros(quiet))
            .fetch_all(&pool)
            .await
            .map_err(convert_sqlx_err)?
            .iter()
            .map(|r| {
                Ok(Seen {
                    name: super::rows_text(r, 0)?,
                    release: super::rows_text(r, 1)?,
                    schema_version: r.try_get("schema_version")?,
                    ago: Duration::from_micros(r.try_get::<i64, _>("ago_us")?.max(0) as u64),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(convert_sqlx_err)?;
        // Before the process list is read: a session of this process
        // remembered from here on may not be in it.
        let read_at = std::time::Instant::now();
        let sessions = sqlx::query(include_str!("queries/fleet/sessions.sql"))
            .fetch_all(&pool)
            .await
            .map_err(convert_sqlx_err)?
            .iter()
            .map(|r| {
                Ok((
                    r.try_get::<i64, _>("id")?.max(0) as u64,
                    super::rows_text(r, 1)?,
                    super::rows_text(r, 2)?,
                    r.try_get::<i64, _>("registered")? != 0,
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(convert_sqlx_err)?;
        let database = self.nodes[0].get_database().unwrap_or_default();
        let unregistered = unregistered(&sessions, database, read_at);
        Ok(FleetView {
            coordinators,
            unregistered,
            transitions: self.transitions().await?,
        })
    }

    /// Every schema transition of this database.
    pub async fn transitions(&self) -> Result<Vec<Transition>, CoordinatorError> {
        sqlx::query(include_str!("queries/fleet/transitions.sql"))
            .fetch_all(&self.pool())
            .await
            .map_err(convert_sqlx_err)?
            .iter()
            .map(|r| {
                Ok(Transition {
                    name: super::rows_text(r, 0)?,
                    release: super::rows_text(r, 1)?,
                    completed: r.try_get::<i64, _>("completed")? != 0,
                    backfills: r.try_get("backfills")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(convert_sqlx_err)
    }

    /// Runs transition `name`'s backfill and marks it complete, once: under
    /// the transition's row lock, so of two coordinators deciding at once
    /// the second finds it done; and only once no coordinator has seen an
    /// older one for `quiet` (the transition's `opened_at`, moved at every
    /// sighting). A lock wait or deadlock behind a claim is run again and
    /// counted.
    ///
    /// Errors: `InvalidArgument` for a transition this release does not
    /// know; `DatabaseUnavailable`, `CommitOutcomeUnknown`.
    pub async fn backfill(
        &self,
        name: &str,
        by: &str,
        quiet: Duration,
    ) -> Result<Backfill, CoordinatorError> {
        let sql = match name {
            OBSERVATIONS_FLAG => include_str!("queries/fleet/backfill_observations_flag.sql"),
            other => {
                return Err(super::schema::schema_refused(format!(
                    "transition {other} is not one this release knows"
                )))
            }
        };
        transaction!(self, |tx| async {
            let state = sqlx::query(include_str!("queries/fleet/lock_transition.sql"))
                .bind(micros(quiet))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
            let decided = match state {
                None => Some(Backfill::Complete),
                Some(r) if r.try_get::<i64, _>(0)? != 0 => Some(Backfill::Complete),
                Some(r) if r.try_get::<i64, _>(1)? == 0 => Some(Backfill::NotQuietYet),
                Some(_) => None,
            };
            if let Some(d) = decided {
                return Ok(d);
            }
            self.pause_in(super::PausePoint::BackfillBeforeWrite, tx)
                .await;
            let changed = sqlx::query(sql).execute(&mut *tx).await?.rows_affected();
            sqlx::query(include_str!("queries/fleet/complete_transition.sql"))
                .bind(by)
                .bind(changed)
                .bind(name)
                .execute(&mut *tx)
                .await?;
            Ok(Backfill::Ran(changed))
        })
    }

    /// Reopens transition `name` and starts its quiet period now (an
    /// older coordinator is seen, or may have run while no newer one
    /// watched). True when it was complete.
    pub async fn reopen_transition(&self, name: &str) -> Result<bool, CoordinatorError> {
        let was_complete = self
            .transitions()
            .await?
            .iter()
            .any(|t| t.name == name && t.completed);
        sqlx::query(include_str!("queries/fleet/reopen_transition.sql"))
            .bind(name)
            .execute(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        Ok(was_complete)
    }
}

/// What [`JobStore::backfill`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backfill {
    /// It ran, changing this many rows.
    Ran(u64),
    /// The transition was complete already (another coordinator ran it).
    Complete,
    /// A coordinator saw an older one within the quiet period.
    NotQuietYet,
}

/// The sessions (id, host, node, registered) no jobfence process of this
/// release or newer registered and this process did not open; this
/// process's sessions that closed before the list was read (`read_at`)
/// are forgotten.
fn unregistered(
    sessions: &[(u64, String, String, bool)],
    database: &str,
    read_at: std::time::Instant,
) -> Vec<Unregistered> {
    if let Some((_, _, node, _)) = sessions.first() {
        let live: BTreeSet<u64> = sessions.iter().map(|s| s.0).collect();
        sessions::forget_closed(node, database, &live, read_at);
    }
    sessions
        .iter()
        .filter(|(id, _, node, registered)| !registered && !sessions::is_own(node, *id))
        .map(|(id, host, _, _)| Unregistered {
            connection_id: *id,
            host: host.clone(),
        })
        .collect()
}

/// Whether `a` is an older release than `b` (semver: major.minor.patch,
/// numbers compared; a pre-release suffix is ignored).
pub fn older_release(a: &str, b: &str) -> bool {
    fn parts(v: &str) -> Vec<u64> {
        v.split(['-', '+'])
            .next()
            .unwrap_or("")
            .split('.')
            .map(|p| p.parse().unwrap_or(0))
            .collect()
    }
    parts(a) < parts(b)
}

#[cfg(test)]
mod tests {
    use super::older_release;

    #[test]
    fn releases_compare_by_number() {
        assert!(older_release("0.1.0", "0.2.0"));
        assert!(older_release("0.9.0", "0.10.0"));
        assert!(!older_release("0.2.0", "0.2.0"));
        assert!(!older_release("1.0.0", "0.10.0"));
    }
}
