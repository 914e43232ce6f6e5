//! Plain (non-locking) reads of jobs and observations.

use super::rows::{self, JOB_COLUMNS, OBSERVATION_COLUMNS};
use super::{convert_sqlx_err, JobStore};
use crate::domain::policy::DispatchFacts;
use crate::domain::{CoordinatorError, Job, Observation};
use sqlx::MySqlConnection;
use std::collections::HashMap;
use std::sync::LazyLock;

static SELECT_JOB: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?"));
static SELECT_JOB_BY_KEY: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {JOB_COLUMNS}, request_digest FROM jobs WHERE queue = ? AND operation_key = ?")
});
static SELECT_OBSERVATION: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {OBSERVATION_COLUMNS} FROM job_observations WHERE job_id = ? AND dedup_key = ?")
});

fn placeholders(n: usize) -> String {
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

/// Several jobs by id, in the order of `ids` (missing ones are left out).
pub(crate) async fn jobs(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<Vec<Job>, CoordinatorError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE id IN ({})",
        placeholders(ids.len())
    );
    let mut query = sqlx::query(&sql);
    for id in ids {
        query = query.bind(*id);
    }
    let fetched = query.fetch_all(conn).await.map_err(convert_sqlx_err)?;
    let mut by_id = fetched
        .iter()
        .map(|r| rows::job(r).map(|j| (j.id, j)))
        .collect::<Result<HashMap<_, _>, _>>()?;
    Ok(ids.iter().filter_map(|id| by_id.remove(id)).collect())
}

/// One job by its business identity, with its stored request digest.
pub(crate) async fn job_by_key(
    conn: &mut MySqlConnection,
    queue: &str,
    operation_key: &str,
) -> Result<Option<(Job, Vec<u8>)>, CoordinatorError> {
    let row = sqlx::query(&SELECT_JOB_BY_KEY)
        .bind(queue)
        .bind(operation_key)
        .fetch_optional(conn)
        .await
        .map_err(convert_sqlx_err)?;
    row.map(|r| Ok((rows::job(&r)?, rows::get::<Vec<u8>>(&r, "request_digest")?)))
        .transpose()
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
    let sql = format!(
        "SELECT {OBSERVATION_COLUMNS} FROM job_observations WHERE job_id IN ({}) ORDER BY id",
        placeholders(ids.len())
    );
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
    /// A job and its observations (oldest first); `JobNotFound` if absent.
    pub async fn get_job(&self, id: u64) -> Result<(Job, Vec<Observation>), CoordinatorError> {
        let mut conn = self.pool.acquire().await.map_err(convert_sqlx_err)?;
        let job = job(&mut conn, id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: id })?;
        let mut obs = observations(&mut conn, &[id]).await?;
        Ok((job, obs.remove(&id).unwrap_or_default()))
    }
}

static LOCK_JOB: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {JOB_COLUMNS}, \
         CAST(TIMESTAMPDIFF(MICROSECOND, first_dispatched_at, UTC_TIMESTAMP(6)) AS SIGNED) AS since_first_dispatch_us, \
         CAST(lease_until <= UTC_TIMESTAMP(6) AS SIGNED) AS lease_expired \
         FROM jobs WHERE id = ? FOR UPDATE"
    )
});

/// A job read under its row lock, with the DB-clock facts decisions need.
#[derive(Debug)]
pub(crate) struct LockedJob {
    pub job: Job,
    /// Dispatch facts for the resend policy.
    pub dispatch: DispatchFacts,
    /// `lease_until <= UTC_TIMESTAMP(6)` (false when there is no lease).
    pub lease_expired: bool,
}

/// Converts a DB-measured microsecond difference (never negative in
/// practice; a clock step backwards reads as zero).
pub(crate) fn elapsed(us: Option<i64>) -> Option<std::time::Duration> {
    us.map(|us| std::time::Duration::from_micros(us.max(0) as u64))
}

/// `SELECT … FOR UPDATE` of one job by primary key: the lock every
/// takeover and fenced write decides under.
pub(crate) async fn lock_job(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<LockedJob>, CoordinatorError> {
    let row = sqlx::query(&LOCK_JOB)
        .bind(id)
        .fetch_optional(conn)
        .await
        .map_err(convert_sqlx_err)?;
    let Some(row) = row else { return Ok(None) };
    let job = rows::job(&row)?;
    let dispatch = DispatchFacts {
        since_first_dispatch: elapsed(rows::get(&row, "since_first_dispatch_us")?),
        dispatch_count: job.dispatch_count,
    };
    let lease_expired = rows::get::<Option<i64>>(&row, "lease_expired")?.unwrap_or(0) != 0;
    Ok(Some(LockedJob {
        job,
        dispatch,
        lease_expired,
    }))
}
