//! Deciding a new line in the transaction that inserts it (docs/design.md
//! rule 15): the common case of a report, one settled refund of a
//! succeeded job, is matched as it is written, with no second write of
//! the line and no second read of it. Only a line that is the first and
//! only one of its key, whose key has no exception not resolved, and
//! whose decision writes nothing beyond the line is decided so; every
//! other line is left undecided for the decision pass.

use super::lines::Held;
use super::{queue_list, string_list};
use crate::convert_sqlx_err;
use crate::rows::{get, opt_text, text};
use jobfence_domain::settlement::records::QueueAmounts;
use jobfence_domain::settlement::{Holder, Outcome, SettlementLine};
use jobfence_domain::{CoordinatorError, JobState};
use sqlx::{MySql, MySqlConnection};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Decides a new line whose key has no other line (stored, or in its
/// batch) and no exception not resolved, from who holds the key:
/// `Some(outcome)` when that outcome needs no write beyond the line (a
/// match, or a line that decides nothing), which is then inserted
/// decided; `None` leaves the line to the decision pass. The coordinator
/// passes its decision (crates/core/src/settlement/decide.rs).
pub type DecideOnInsert<'a> =
    &'a (dyn Fn(Option<&Held>, &SettlementLine) -> Option<Outcome> + Send + Sync);

/// The outcomes `on_insert` gave the batch's `new` lines that may be
/// decided on insert, by provider reference. In `tx`, after the batch's
/// stored lines are locked: reads who holds the keys of every line the
/// batch writes (`written`), locks those holders that are finished jobs or
/// key records (so two imports writing lines of one key take turns), then
/// reads which keys have lines already and which have an exception not
/// resolved.
pub(super) async fn decide_on_insert(
    tx: &mut MySqlConnection,
    provider: &str,
    queues: &[QueueAmounts],
    written: &[&SettlementLine],
    new: &HashSet<&str>,
    on_insert: DecideOnInsert<'_>,
) -> Result<HashMap<String, Outcome>, CoordinatorError> {
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for l in written {
        if let Some(k) = &l.operation_key {
            *per_key.entry(k.as_str()).or_default() += 1;
        }
    }
    let mut out = HashMap::new();
    if per_key.is_empty() {
        return Ok(out);
    }
    let keys: Vec<&str> = per_key.keys().copied().collect();
    let holders = holders_on(&mut *tx, queues, &keys).await?;
    lock_finished_holders(tx, &holders).await?;
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
        if let Some(outcome) = on_insert(holders.get(key), l) {
            out.insert(l.provider_reference.clone(), outcome);
        }
    }
    Ok(out)
}

/// Locks the finished jobs and key records among `holders`, in id order.
async fn lock_finished_holders(
    tx: &mut MySqlConnection,
    holders: &HashMap<String, Held>,
) -> Result<(), CoordinatorError> {
    let (mut jobs, mut records) = (Vec::new(), Vec::new());
    for h in holders.values() {
        match h.holder {
            Holder::Job { id, state, .. } if state.is_terminal() => jobs.push(id),
            Holder::Pruned { job_id, .. } => records.push(job_id),
            _ => {}
        }
    }
    for (ids, sql) in [
        (
            jobs,
            include_str!("../queries/settlement/lock_finished_jobs.sql"),
        ),
        (
            records,
            include_str!("../queries/settlement/lock_key_records.sql"),
        ),
    ] {
        if ids.is_empty() {
            continue;
        }
        let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query(&sql.replace("{ids}", &list))
            .fetch_all(&mut *tx)
            .await
            .map_err(convert_sqlx_err)?;
    }
    Ok(())
}

async fn keys_with_lines(
    tx: &mut MySqlConnection,
    provider: &str,
    keys: &[&str],
) -> Result<HashSet<String>, CoordinatorError> {
    let sql = include_str!("../queries/settlement/keys_with_lines.sql")
        .replace("{keys}", &string_list(keys.iter().copied()));
    let found: Vec<String> = sqlx::query_scalar(&sql)
        .bind(provider)
        .fetch_all(&mut *tx)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(found.into_iter().collect())
}

/// Which of `subjects` have an exception of the provider not resolved.
pub(super) async fn unresolved_subjects_on<'e, E>(
    e: E,
    provider: &str,
    subjects: &[&str],
) -> Result<HashSet<String>, CoordinatorError>
where
    E: sqlx::Executor<'e, Database = MySql>,
{
    if subjects.is_empty() {
        return Ok(Default::default());
    }
    let sql = include_str!("../queries/settlement/unresolved_subjects.sql")
        .replace("{subjects}", &string_list(subjects.iter().copied()));
    let found: Vec<String> = sqlx::query_scalar(&sql)
        .bind(provider)
        .fetch_all(e)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(found.into_iter().collect())
}

/// Who holds each of `keys` among `queues`: a job (with its payload),
/// else a pruned job's key record; absent keys are held by nobody.
pub(super) async fn holders_on<'e, E>(
    e: E,
    queues: &[QueueAmounts],
    keys: &[&str],
) -> Result<HashMap<String, Held>, CoordinatorError>
where
    E: sqlx::Executor<'e, Database = MySql>,
{
    let mut out = HashMap::new();
    if keys.is_empty() || queues.is_empty() {
        return Ok(out);
    }
    let sql = include_str!("../queries/settlement/holders.sql")
        .replace("{queues}", &queue_list(queues)?)
        .replace("{keys}", &string_list(keys.iter().copied()));
    let rows = sqlx::query(&sql)
        .fetch_all(e)
        .await
        .map_err(convert_sqlx_err)?;
    for row in &rows {
        let key = text(row, "operation_key")?;
        let held = held_row(row)?;
        // A live job wins over a key record of the same key (a key whose
        // record expired and was enqueued again).
        let keep = !matches!(
            out.get(&key),
            Some(Held {
                holder: Holder::Job { .. },
                ..
            })
        );
        if keep {
            out.insert(key, held);
        }
    }
    Ok(out)
}

fn held_row(row: &sqlx::mysql::MySqlRow) -> Result<Held, CoordinatorError> {
    let state: JobState = text(row, "state")?
        .parse()
        .map_err(|e| CoordinatorError::Internal(format!("{e}")))?;
    let job_id: u64 = get(row, "job_id")?;
    let queue = Some(text(row, "queue")?);
    Ok(if text(row, "kind")? == "job" {
        Held {
            holder: Holder::Job {
                id: job_id,
                state,
                attempt: get(row, "attempt")?,
                amount: None,
            },
            queue,
            payload: opt_text(row, "payload")?,
        }
    } else {
        Held {
            holder: Holder::Pruned {
                job_id,
                final_state: state,
            },
            queue,
            payload: None,
        }
    })
}
