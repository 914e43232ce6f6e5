//! Operator reads: ListJobs, QueueStats and the pending ages behind the
//! `jobfence_oldest_*_age_seconds` gauges. None of them scans finished jobs
//! except QueueStats' counts (an index-only count, on demand).

use super::super::batch::with_job_columns;
use super::super::reads::{elapsed, placeholders};
use super::super::rows::{self, get, text};
use super::super::{convert_sqlx_err, micros, JobStore};
use crate::run::{read, Body};
use jobfence_domain::admin::{
    DueKeys, KeyBacklog, ListJobsFilter, OldestJob, PendingAges, QueueStats, PENDING, TOP_DUE_KEYS,
};
use jobfence_domain::{CoordinatorError, EventKind, Job, JobState};
use sqlx::MySqlConnection;
use std::collections::BTreeMap;
use std::time::Duration;

/// A LIKE pattern matching every string that starts with `prefix`, with
/// `!` as the escape character (keys are full of `_`, a LIKE wildcard).
fn like_prefix(prefix: &str) -> String {
    let mut p = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '!' | '%' | '_') {
            p.push('!');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// The conditions of `queries/admin/list_jobs.sql`'s `{filters}` that
/// `filter` asks for, in the order their values are bound.
fn list_filters(filter: &ListJobsFilter) -> String {
    let mut sql = String::new();
    if filter.queue.is_some() {
        sql.push_str(" AND queue = ?");
    }
    if !filter.states.is_empty() {
        sql.push_str(" AND state IN (");
        sql.push_str(&placeholders(filter.states.len()));
        sql.push(')');
    }
    if filter.min_age.is_some() {
        sql.push_str(" AND created_at <= DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)");
    }
    if filter.operation_key.is_some() {
        sql.push_str(" AND operation_key LIKE ? ESCAPE '!'");
    }
    sql
}

fn parse_state(s: &str) -> Result<JobState, CoordinatorError> {
    s.parse()
        .map_err(|e| CoordinatorError::Internal(format!("{e}")))
}

async fn oldest(
    conn: &mut MySqlConnection,
    state: JobState,
    queue: &str,
) -> Result<Option<OldestJob>, CoordinatorError> {
    let query = if state == JobState::Ready {
        sqlx::query(include_str!("../queries/admin/oldest_ready.sql")).bind(queue)
    } else {
        sqlx::query(include_str!("../queries/admin/oldest_in_state.sql"))
            .bind(state.as_str())
            .bind(queue)
    };
    let row = query
        .fetch_optional(&mut *conn)
        .await
        .map_err(convert_sqlx_err)?;
    row.map(|r| {
        Ok(OldestJob {
            job_id: get(&r, "id")?,
            age: elapsed(get(&r, "age_us")?).unwrap_or_default(),
        })
    })
    .transpose()
}

async fn first_created(
    conn: &mut MySqlConnection,
    state: JobState,
    queue: &str,
) -> Result<Option<Duration>, CoordinatorError> {
    let age: Option<Option<i64>> =
        sqlx::query_scalar(include_str!("../queries/admin/first_created.sql"))
            .bind(state.as_str())
            .bind(queue)
            .fetch_optional(&mut *conn)
            .await
            .map_err(convert_sqlx_err)?;
    Ok(elapsed(age.flatten()))
}

impl JobStore {
    /// The pending ages of every queue with pending jobs (or of `queue`
    /// only). A handful of index dives per (queue, state) pair; see the SQL.
    pub async fn pending_ages_of(
        &self,
        queue: Option<&str>,
    ) -> Result<PendingAges, CoordinatorError> {
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        let pairs = sqlx::query(include_str!("../queries/admin/pending_queues.sql"))
            .fetch_all(&mut *conn)
            .await
            .map_err(convert_sqlx_err)?;
        let mut ages = PendingAges::default();
        for row in &pairs {
            let state = parse_state(&text(row, "state")?)?;
            let q = text(row, "queue")?;
            if queue.is_some_and(|want| want != q) {
                continue;
            }
            let i = PENDING
                .iter()
                .position(|s| *s == state)
                .expect("the query selects pending states only");
            let oldest = oldest(&mut conn, state, &q).await?;
            let created = first_created(&mut conn, state, &q).await?;
            let entry = ages.queues.entry(q).or_default();
            entry.oldest[i] = oldest;
            entry.unfinished = entry.unfinished.max(created);
        }
        Ok(ages)
    }

    /// [`Self::pending_ages_of`] every queue: what the gauges show.
    pub async fn pending_ages(&self) -> Result<PendingAges, CoordinatorError> {
        self.pending_ages_of(None).await
    }

    /// Jobs matching `filter`, by ascending id, at most `filter.limit`.
    pub async fn list_jobs(&self, filter: &ListJobsFilter) -> Result<Vec<Job>, CoordinatorError> {
        read!(self, |conn| self.list_jobs_in(conn, filter))
    }

    async fn list_jobs_in(
        &self,
        conn: &mut MySqlConnection,
        filter: &ListJobsFilter,
    ) -> Body<Vec<Job>> {
        let sql = with_job_columns(include_str!("../queries/admin/list_jobs.sql"))
            .replace("{filters}", &list_filters(filter));
        let mut query = sqlx::query(&sql).bind(filter.after_id);
        if let Some(q) = &filter.queue {
            query = query.bind(q);
        }
        for s in &filter.states {
            query = query.bind(s.as_str());
        }
        if let Some(age) = filter.min_age {
            query = query.bind(micros(age));
        }
        if let Some(prefix) = &filter.operation_key {
            query = query.bind(like_prefix(prefix));
        }
        let fetched = query
            .bind(filter.limit.max(1))
            .fetch_all(&mut *conn)
            .await?;
        Ok(fetched.iter().map(rows::job).collect::<Result<_, _>>()?)
    }

    /// Per queue (or `queue` only): jobs by state, pending ages, and the
    /// takeovers and stale-write rejections of the last `window`.
    pub async fn queue_stats(
        &self,
        queue: Option<&str>,
        window: Duration,
    ) -> Result<Vec<QueueStats>, CoordinatorError> {
        read!(self, |conn| self.queue_stats_in(conn, queue, window))
    }

    async fn queue_stats_in(
        &self,
        conn: &mut MySqlConnection,
        queue: Option<&str>,
        window: Duration,
    ) -> Body<Vec<QueueStats>> {
        let mut by_queue: BTreeMap<String, QueueStats> = BTreeMap::new();
        let counts = match queue {
            Some(q) => {
                sqlx::query(include_str!("../queries/admin/state_counts_of_queue.sql")).bind(q)
            }
            None => sqlx::query(include_str!("../queries/admin/state_counts.sql")),
        }
        .fetch_all(&mut *conn)
        .await?;
        for row in &counts {
            let q = text(row, "queue")?;
            let state = parse_state(&text(row, "state")?)?;
            let n: i64 = get(row, "n")?;
            let entry = by_queue.entry(q.clone()).or_insert_with(|| QueueStats {
                queue: q,
                ..Default::default()
            });
            entry.counts.push((state, n.max(0) as u64));
        }
        for stats in by_queue.values_mut() {
            stats
                .counts
                .sort_by_key(|(s, _)| JobState::ALL.iter().position(|x| x == s));
        }
        let ages = self.pending_ages_of(queue).await?;
        for (q, pending) in ages.queues {
            if let Some(stats) = by_queue.get_mut(&q) {
                stats.pending = pending;
            }
        }
        let windowed = sqlx::query(include_str!("../queries/admin/window_counts.sql"))
            .bind(micros(window))
            .fetch_all(&mut *conn)
            .await?;
        for row in &windowed {
            let q = text(row, "queue")?;
            let Some(stats) = by_queue.get_mut(&q) else {
                continue;
            };
            let n: i64 = get(row, "n")?;
            // window_counts.sql reads these two kinds only.
            match text(row, "kind")?.parse() {
                Ok(EventKind::TakenOver) => stats.takeovers = n.max(0) as u64,
                _ => stats.stale_write_rejections = n.max(0) as u64,
            }
        }
        for stats in by_queue.values_mut() {
            if stats
                .counts
                .iter()
                .any(|&(s, n)| s == JobState::Ready && n > 0)
            {
                stats.due_keys = due_keys(conn, &stats.queue).await?;
            }
        }
        Ok(by_queue.into_values().collect())
    }
}

/// A queue's due ready jobs by fairness key: the top [`TOP_DUE_KEYS`] and
/// the rest summed (docs/design.md rule 18).
async fn due_keys(conn: &mut MySqlConnection, queue: &str) -> Result<DueKeys, CoordinatorError> {
    let found = sqlx::query(include_str!("../queries/admin/due_keys.sql"))
        .bind(queue)
        .bind(TOP_DUE_KEYS as u64)
        .fetch_all(&mut *conn)
        .await
        .map_err(convert_sqlx_err)?;
    let mut out = DueKeys::default();
    let (mut keys_total, mut jobs_total) = (0, 0);
    for row in &found {
        let key = text(row, "fairness_key")?;
        keys_total = get::<i64>(row, "keys_total")?.max(0) as u64;
        jobs_total = get::<i64>(row, "jobs_total")?.max(0) as u64;
        out.top.push(KeyBacklog {
            fairness_key: (!key.is_empty()).then_some(key),
            keys: 1,
            due: get::<i64>(row, "n")?.max(0) as u64,
            oldest_due: age(get(row, "age_us")?),
        });
    }
    let shown: u64 = out.top.iter().map(|k| k.due).sum();
    if keys_total > out.top.len() as u64 {
        let top: Vec<&str> = out
            .top
            .iter()
            .map(|k| k.fairness_key.as_deref().unwrap_or(""))
            .collect();
        let age_us: Option<i64> =
            sqlx::query_scalar(include_str!("../queries/admin/due_others.sql"))
                .bind(queue)
                .bind(super::super::batch::json(&top)?)
                .fetch_one(&mut *conn)
                .await
                .map_err(convert_sqlx_err)?;
        out.others = Some(KeyBacklog {
            fairness_key: None,
            keys: keys_total - out.top.len() as u64,
            due: jobs_total.saturating_sub(shown),
            oldest_due: age(age_us.unwrap_or(0)),
        });
    }
    Ok(out)
}

fn age(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

impl JobStore {
    /// The queue of a job, if it exists: a primary-key read, for labelling
    /// a refused write that did not say which queue it was about.
    pub async fn queue_of(&self, job_id: u64) -> Result<Option<String>, CoordinatorError> {
        let row = sqlx::query(include_str!("../queries/jobs/queue_of.sql"))
            .bind(job_id)
            .fetch_optional(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        row.map(|r| text(&r, "queue")).transpose()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_pattern_escapes_like_wildcards() {
        assert_eq!(super::like_prefix("refund-pay_1"), "refund-pay!_1%");
        assert_eq!(super::like_prefix("a%b!"), "a!%b!!%");
    }
}
