//! A job's place in the fair order (docs/design.md rule 18) when it goes
//! back to `ready` (a retry, an operator's retry of a job in manual
//! review): the back of its (fairness key, priority) line, as a new job
//! of the key. A job that kept its old round would go before every job
//! that arrived since, so one merchant's failing refunds, all retried,
//! would starve the others.
//!
//! Enqueue places new jobs in its own statement
//! (`queries/enqueue/insert.sql`); both use
//! [`jobfence_domain::fairness::start_rounds`]'s rule.
//!
//! Lock order: the lines' rows (`fairness_keys`) are locked after the
//! jobs' own rows, in primary-key order, and whoever holds one waits for
//! no job row (an Enqueue upserts them last, after its inserts). Two
//! transactions that both create a line's row may still deadlock on its
//! insert intention (an Enqueue beside a round placing a job of a line
//! with no row yet): the database refuses one, and it is run again and
//! counted as any conflict.

use super::batch::{self, json, Change};
use super::literal;
use super::rows;
use jobfence_domain::fairness::{start_rounds, Priority, UNPLACED};
use jobfence_domain::{CoordinatorError, Job, JobState};
use serde::Serialize;
use sqlx::MySqlConnection;
use std::collections::{BTreeMap, HashMap};

/// One (queue, fairness key, priority) line.
#[derive(Serialize, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Line<'a> {
    queue: &'a str,
    fairness_key: &'a str,
    priority: u8,
}

#[derive(Serialize)]
struct Placed {
    id: u64,
    round: i64,
}

#[derive(Serialize)]
struct Last<'a> {
    queue: &'a str,
    fairness_key: &'a str,
    priority: u8,
    last_round: i64,
}

/// The jobs of `changes` that go back to `ready` from another state, and
/// whether each is due at once (no retry delay).
pub(crate) fn requeued<'a>(changes: &[Change<'a>]) -> Vec<(&'a Job, bool)> {
    changes
        .iter()
        .filter(|c| c.after.state == JobState::Ready && c.before.state != JobState::Ready)
        .map(|c| (c.after, c.after.run_at <= c.after.updated_at))
        .collect()
}

/// Puts `jobs` (going back to `ready` in this transaction, or coming due
/// unplaced; their rows locked) at the back of their lines: reads each
/// queue's frontier, locks the lines' rows, and writes the jobs' new
/// rounds and the lines' last rounds. A job that is not due yet (`false`)
/// is left [`UNPLACED`] instead, to be placed when it comes due. Nothing
/// when `jobs` is empty (the common case: one check, no statement).
pub(crate) async fn back_in_line(
    conn: &mut MySqlConnection,
    jobs: &[(&Job, bool)],
) -> Result<(), CoordinatorError> {
    if jobs.is_empty() {
        return Ok(());
    }
    let mut placed: Vec<Placed> = jobs
        .iter()
        .filter(|(_, due)| !due)
        .map(|(job, _)| Placed {
            id: job.id,
            round: UNPLACED,
        })
        .collect();
    let mut lines: BTreeMap<Line, Vec<&Job>> = BTreeMap::new();
    for (job, _) in jobs.iter().filter(|(_, due)| *due) {
        lines.entry(line(job)).or_default().push(job);
    }
    let mut frontiers = HashMap::new();
    for l in lines.keys() {
        if !frontiers.contains_key(l.queue) {
            frontiers.insert(l.queue, frontier(conn, l.queue).await?);
        }
    }
    let last = match lines.is_empty() {
        true => HashMap::new(),
        false => lock_lines(conn, lines.keys().cloned().collect()).await?,
    };
    let mut lasts = Vec::new();
    for (l, members) in &lines {
        let rounds = start_rounds(last.get(l).copied(), frontiers[l.queue], members.len());
        let mut newest = 0;
        for (job, start) in members.iter().zip(rounds) {
            placed.push(Placed {
                id: job.id,
                round: start - job.priority.head_start(),
            });
            newest = start;
        }
        lasts.push(Last {
            queue: l.queue,
            fairness_key: l.fairness_key,
            priority: l.priority,
            last_round: newest,
        });
    }
    if lasts.is_empty() {
        let sql = include_str!("queries/fairness/place.sql")
            .split(';')
            .next()
            .unwrap_or_default()
            .replacen('?', &literal_json(json(&placed)?), 1);
        batch::result_sets(conn, &sql).await?;
        return Ok(());
    }
    let sql = include_str!("queries/fairness/place.sql")
        .replacen('?', &literal_json(json(&placed)?), 1)
        .replacen('?', &literal_json(json(&lasts)?), 1);
    batch::result_sets(conn, &sql).await?;
    Ok(())
}

fn line(job: &Job) -> Line<'_> {
    Line {
        queue: &job.queue,
        fairness_key: job.fairness_key.as_deref().unwrap_or(""),
        priority: job.priority.get(),
    }
}

/// The queue's frontier: the highest round handed out.
async fn frontier(conn: &mut MySqlConnection, queue: &str) -> Result<i64, CoordinatorError> {
    let row = sqlx::query(include_str!("queries/fairness/frontier.sql"))
        .bind(queue)
        .bind(queue)
        .bind(queue)
        .bind(queue)
        .fetch_one(conn)
        .await
        .map_err(super::convert_sqlx_err)?;
    rows::get(&row, "frontier")
}

/// The last start round of each of `lines` that has one, locked.
async fn lock_lines<'a>(
    conn: &mut MySqlConnection,
    lines: Vec<Line<'a>>,
) -> Result<HashMap<Line<'a>, i64>, CoordinatorError> {
    let found = sqlx::query(include_str!("queries/fairness/lock_lines.sql"))
        .bind(json(&lines)?)
        .fetch_all(conn)
        .await
        .map_err(super::convert_sqlx_err)?;
    let mut out = HashMap::new();
    for row in &found {
        let (queue, key) = (rows::text(row, "queue")?, rows::text(row, "fairness_key")?);
        let priority = Priority::stored(rows::get(row, "priority")?).get();
        let last: i64 = rows::get(row, "last_round")?;
        if let Some(l) = lines
            .iter()
            .find(|l| l.queue == queue && l.fairness_key == key && l.priority == priority)
        {
            out.insert(l.clone(), last);
        }
    }
    Ok(out)
}

/// `json` as a SQL string literal.
fn literal_json(json: String) -> String {
    let mut s = String::new();
    literal::Literal::write_sql(json.as_str(), &mut s);
    s
}
