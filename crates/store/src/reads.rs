//! Plain (non-locking) reads of jobs and observations.

use super::batch::with_job_columns;
use super::rows::{self, OBSERVATION_COLUMNS};
use super::{convert_sqlx_err, JobStore};
use crate::run::{read, Body};
use jobfence_domain::policy::DispatchFacts;
use jobfence_domain::{CoordinatorError, DbTime, Job, Observation};
use sqlx::MySqlConnection;
use std::collections::HashMap;
use std::sync::LazyLock;

static SELECT_JOB: LazyLock<String> =
    LazyLock::new(|| with_job_columns(include_str!("queries/jobs/by_id.sql")));
static SELECT_OBSERVATION: LazyLock<String> =
    LazyLock::new(|| with_observation_columns(include_str!("queries/observations/by_key.sql")));

/// `sql` with `{observation_columns}` replaced by [`OBSERVATION_COLUMNS`].
fn with_observation_columns(sql: &str) -> String {
    sql.replace("{observation_columns}", OBSERVATION_COLUMNS)
}

/// `n` placeholders, `?, ?, …`, for a statement's `{…}` list of values.
pub(crate) fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// One job by id.
pub(crate) async fn job(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<Job>, CoordinatorError> {
    let row = sqlx::query(&SELECT_JOB)
        .bind(id)
        .fetch_optional(conn)
        .await
        .map_err(convert_sqlx_err)?;
    row.as_ref().map(rows::job).transpose()
}

/// The observations of each job in `ids`, oldest first.
pub(crate) async fn observations(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<HashMap<u64, Vec<Observation>>, CoordinatorError> {
    let mut out: HashMap<u64, Vec<Observation>> = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let sql = with_observation_columns(include_str!("queries/observations/of_jobs.sql"))
        .replace("{ids}", &placeholders(ids.len()));
    let mut query = sqlx::query(&sql);
    for id in ids {
        query = query.bind(*id);
    }
    for row in query.fetch_all(conn).await.map_err(convert_sqlx_err)? {
        let o = rows::observation(&row)?;
        out.entry(o.job_id).or_default().push(o);
    }
    Ok(out)
}

/// One observation by its de-duplication key.
pub(crate) async fn observation_by_key(
    conn: &mut MySqlConnection,
    job_id: u64,
    dedup_key: &str,
) -> Result<Option<Observation>, CoordinatorError> {
    let row = sqlx::query(&SELECT_OBSERVATION)
        .bind(job_id)
        .bind(dedup_key)
        .fetch_optional(conn)
        .await
        .map_err(convert_sqlx_err)?;
    row.as_ref().map(rows::observation).transpose()
}

impl JobStore {
    /// The database's clock, `UTC_TIMESTAMP(6)` (docs/design.md rule 2):
    /// what a check that is not a statement's own condition compares with.
    pub async fn clock(&self) -> Result<DbTime, CoordinatorError> {
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        let now = super::batch::db_now(&mut conn).await;
        self.outage_named(now).await
    }

    /// A job and its observations (oldest first); `JobNotFound` if absent.
    /// On a Galera node outside the primary component, `DatabaseUnavailable`
    /// (see `outage_or_conflict`).
    pub async fn get_job(&self, id: u64) -> Result<(Job, Vec<Observation>), CoordinatorError> {
        read!(self, |conn| self.get_job_in(conn, id))
    }

    async fn get_job_in(
        &self,
        conn: &mut MySqlConnection,
        id: u64,
    ) -> Body<(Job, Vec<Observation>)> {
        let job = job(conn, id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: id })?;
        let mut obs = observations(conn, &[id]).await?;
        Ok((job, obs.remove(&id).unwrap_or_default()))
    }
}

/// A job read under its row lock, with the DB-clock facts decisions need.
#[derive(Debug)]
pub(crate) struct LockedJob {
    pub job: Job,
    /// Dispatch facts for the resend policy.
    pub dispatch: DispatchFacts,
    /// `lease_until <= UTC_TIMESTAMP(6)` (false when there is no lease).
    pub lease_expired: bool,
    /// Whether any observation of the job exists.
    pub has_observations: bool,
    /// The DB clock when the row was read (`UTC_TIMESTAMP(6)`).
    pub now: DbTime,
}

/// Converts a DB-measured microsecond difference (never negative in
/// practice; a clock step backwards reads as zero).
pub(crate) fn elapsed(us: Option<i64>) -> Option<std::time::Duration> {
    us.map(|us| std::time::Duration::from_micros(us.max(0) as u64))
}

/// `SELECT … FOR UPDATE` of one job by primary key: the lock every
/// operator write decides under (see [`super::batch::lock_jobs`]).
pub(crate) async fn lock_job(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<LockedJob>, CoordinatorError> {
    Ok(super::batch::lock_jobs(conn, &[id]).await?.remove(&id))
}
