//! Deciding a new line in the transaction that inserts it (docs/design.md
//! rule 15): the common case of a report, one settled refund of a
//! succeeded job, is matched as it is written, with no second write of
//! the line and no second read of it. Only a line that is the first and
//! only one of its key, whose key has no exception not resolved, and
//! whose decision writes nothing beyond the line is decided so; every
//! other line is left undecided for the decision pass.

use super::{json_list, FastMap, FastSet};
use crate::convert_sqlx_err;
use crate::rows::{get, opt_text, text};
use jobfence_domain::settlement::held::Held;
use jobfence_domain::settlement::records::QueueAmounts;
use jobfence_domain::settlement::{on_insert, Holder, Outcome, SettlementLine};
use jobfence_domain::{CoordinatorError, JobState};
use sqlx::MySqlConnection;
use std::collections::{BTreeMap, HashSet};

/// The outcomes the domain's `on_insert` gave the batch's `new` lines
/// that may be decided on insert (a line whose key has no other line,
/// stored or in its batch, and no exception not resolved), from who holds
/// their keys, by provider reference. In `tx`, after the batch's
/// stored lines are locked: reads and locks who holds the keys of every
/// line the batch writes (`written`), jobs or key records (so two imports
/// writing lines of one key take turns), then
/// reads which keys have lines already and which have an exception not
/// resolved.
pub(super) async fn decide_on_insert(
    tx: &mut MySqlConnection,
    provider: &str,
    queues: &[QueueAmounts],
    written: &[&SettlementLine],
    new: &FastSet<&str>,
) -> Result<FastMap<String, Outcome>, CoordinatorError> {
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for l in written {
        if let Some(k) = &l.operation_key {
            *per_key.entry(k.as_str()).or_default() += 1;
        }
    }
    let mut out = FastMap::default();
    if per_key.is_empty() {
        return Ok(out);
    }
    let keys: Vec<&str> = per_key.keys().copied().collect();
    let holders = holders_on(&mut *tx, queues, &keys, true).await?;
    let alone: Vec<&SettlementLine> = written
        .iter()
        .copied()
        .filter(|l| new.contains(l.provider_reference.as_str()))
        .filter(|l| l.operation_key.as_deref().map(|k| per_key[k]) == Some(1))
        .collect();
    if alone.is_empty() {
        return Ok(out);
    }
    let keys: Vec<&str> = alone
        .iter()
        .filter_map(|l| l.operation_key.as_deref())
        .collect();
    let taken = keys_with_lines(tx, provider, &keys).await?;
    let with_exceptions = unresolved_subjects_on(&mut *tx, provider, &keys).await?;
    for l in alone {
        let Some(key) = l.operation_key.as_deref() else {
            continue;
        };
        if taken.contains(key) || with_exceptions.contains(key) {
            continue;
        }
        let held = holders.get(key).map_or(&[][..], Vec::as_slice);
        if let Some(outcome) = on_insert(queues, held, l) {
            out.insert(l.provider_reference.clone(), outcome);
        }
    }
    Ok(out)
}

async fn keys_with_lines(
    tx: &mut MySqlConnection,
    provider: &str,
    keys: &[&str],
) -> Result<HashSet<String>, CoordinatorError> {
    first_column(
        sqlx::query(include_str!("../queries/settlement/keys_with_lines.sql"))
            .bind(json_list(keys)?)
            .bind(provider)
            .fetch_all(&mut *tx)
            .await,
    )
}

/// Which of `subjects` have an exception of the provider not resolved.
pub(super) async fn unresolved_subjects_on(
    conn: &mut MySqlConnection,
    provider: &str,
    subjects: &[&str],
) -> Result<HashSet<String>, CoordinatorError> {
    if subjects.is_empty() {
        return Ok(Default::default());
    }
    let sql = include_str!("../queries/settlement/unresolved_subjects.sql");
    first_column(
        sqlx::query(sql)
            .bind(json_list(subjects)?)
            .bind(provider)
            .fetch_all(conn)
            .await,
    )
}

/// The first column of each row, as text.
fn first_column(
    rows: Result<Vec<sqlx::mysql::MySqlRow>, sqlx::Error>,
) -> Result<HashSet<String>, CoordinatorError> {
    rows.map_err(convert_sqlx_err)?
        .iter()
        .map(|r| sqlx::Row::try_get::<String, _>(r, 0).map_err(convert_sqlx_err))
        .collect()
}

/// Who holds each of `keys` among `queues`: every job that does (with its
/// payload and provider reference; more than one when two of the queues
/// used the key), and the key record of a pruned one in each queue where
/// no job holds the key, oldest first; absent keys are held by nobody.
/// With `lock`, the jobs and key records read are locked for the caller's
/// transaction (see holders_jobs.sql).
pub(super) async fn holders_on(
    conn: &mut MySqlConnection,
    queues: &[QueueAmounts],
    keys: &[&str],
    lock: bool,
) -> Result<FastMap<String, Vec<Held>>, CoordinatorError> {
    let mut out: FastMap<String, Vec<Held>> = FastMap::default();
    if keys.is_empty() || queues.is_empty() {
        return Ok(out);
    }
    let names: Vec<&str> = queues.iter().map(|q| q.queue.as_str()).collect();
    let lock = if lock { "FOR UPDATE" } else { "" };
    let jobs = include_str!("../queries/settlement/holders_jobs.sql");
    for (key, held) in read_holders(conn, jobs, lock, &names, keys, HolderKind::Job).await? {
        out.entry(key).or_default().extend(held);
    }
    // A key record is read for a key some queue holds no job of (in one
    // of a single queue's, only when no job holds it at all).
    let left: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| out.get(*k).is_none_or(|h| h.len() < names.len()))
        .collect();
    if !left.is_empty() {
        let records = include_str!("../queries/settlement/holders_keys.sql");
        let read = read_holders(conn, records, lock, &names, &left, HolderKind::Record).await?;
        for (key, records) in read {
            let held = out.entry(key).or_default();
            // A job wins over a key record of its key in its own queue (a
            // key whose record expired and was enqueued again, or the
            // record of the job itself): a record counts only in a queue
            // where no job holds the key.
            let kept: Vec<Held> = records
                .into_iter()
                .filter(|r| !held.iter().any(|j| j.queue == r.queue))
                .collect();
            held.extend(kept);
        }
    }
    // Oldest first, whatever order the rows come in.
    for held in out.values_mut() {
        held.sort_by_key(|h| h.holder.job_id());
    }
    out.retain(|_, held| !held.is_empty());
    Ok(out)
}

/// The rows of one holders statement (`sql`, with `{lock}`), by key.
async fn read_holders(
    conn: &mut MySqlConnection,
    sql: &str,
    lock: &str,
    queues: &[&str],
    keys: &[&str],
    kind: HolderKind,
) -> Result<FastMap<String, Vec<Held>>, CoordinatorError> {
    // The lock varies by caller, not by batch: two texts of each
    // statement, each prepared once per connection.
    let sql = sql.replace("{lock}", lock);
    let rows = sqlx::query(&sql)
        .bind(json_list(queues)?)
        .bind(json_list(keys)?)
        .fetch_all(&mut *conn)
        .await
        .map_err(convert_sqlx_err)?;
    let mut found: FastMap<String, Vec<Held>> =
        FastMap::with_capacity_and_hasher(rows.len(), Default::default());
    for row in &rows {
        found
            .entry(text(row, "operation_key")?)
            .or_default()
            .push(held_row(row, kind)?);
    }
    Ok(found)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum HolderKind {
    Job,
    Record,
}

fn held_row(row: &sqlx::mysql::MySqlRow, kind: HolderKind) -> Result<Held, CoordinatorError> {
    let state: JobState = text(row, "state")?
        .parse()
        .map_err(|e| CoordinatorError::Internal(format!("{e}")))?;
    let job_id: u64 = get(row, "job_id")?;
    let queue = Some(text(row, "queue")?);
    Ok(if kind == HolderKind::Job {
        Held {
            holder: Holder::Job {
                id: job_id,
                state,
                attempt: get(row, "attempt")?,
                amount: None,
            },
            queue,
            payload: opt_text(row, "payload")?,
            provider_reference: opt_text(row, "provider_reference")?,
        }
    } else {
        Held {
            holder: Holder::Pruned {
                job_id,
                final_state: state,
            },
            queue,
            payload: None,
            provider_reference: opt_text(row, "provider_reference")?,
        }
    })
}
