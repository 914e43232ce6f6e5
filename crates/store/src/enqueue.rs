//! Enqueue, idempotent on (queue, operation_key), one job or a batch.
//!
//! A batch is one transaction: look the keys up, insert the new ones with
//! multi-row statements, read their ids back by key (ids are not assumed
//! consecutive: MySQL's interleaved auto-increment and Galera's offsets do
//! not give that), and append one `enqueued` event each. Each item gets the
//! answer a single Enqueue would: created, the same request again
//! (`created = false`), or `OperationKeyConflict`.

use super::batch::{hex, json, with_job_columns};
use super::errors::{convert_commit_err, is_unique_violation};
use super::events::{self, call_digest, NewEvent};
use super::literal;
use super::pause::PausePoint;
use super::run::{batch_transaction, Body, Failure};
use super::tx::Tx;
use super::{convert_sqlx_err, micros, rows, JobStore};
use jobfence_domain::{CoordinatorError, Enqueue, EnqueueOutcome, Job, JobState};
use serde::Serialize;
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;
use std::collections::HashMap;
use std::sync::LazyLock;

/// The INSERT of new jobs whose keys a look-up found free (no guard).
static INSERT_LOOKED_UP: LazyLock<String> =
    LazyLock::new(|| include_str!("queries/enqueue/insert.sql").replace("{guard}", ""));

static BY_KEYS: LazyLock<String> =
    LazyLock::new(|| with_job_columns(include_str!("queries/enqueue/by_keys.sql")));

/// Most bytes of payload one INSERT statement carries; a larger batch is
/// inserted with several statements in its one transaction. JSON escaping
/// can grow text up to six times, which stays under the database's
/// `max_allowed_packet` (16 MiB by default on MariaDB, 64 MiB on MySQL).
const INSERT_CHUNK_BYTES: usize = 1 << 20;

/// The answer to one item of a batch.
pub type EnqueueResult = Result<EnqueueOutcome, CoordinatorError>;

#[derive(Serialize)]
struct Key<'a> {
    queue: &'a str,
    operation_key: &'a str,
}

#[derive(Serialize)]
struct NewRow<'a> {
    queue: &'a str,
    operation_key: &'a str,
    request_digest: String,
    payload: &'a str,
    delay_us: i64,
    priority: u8,
    /// `""` for none: such jobs share one key of their queue.
    fairness_key: &'a str,
}

impl JobStore {
    /// Inserts a `ready` job with next_action `execute`. The same (queue,
    /// operation_key, payload) again returns the existing job with
    /// `created = false`; the same key with another payload is
    /// `OperationKeyConflict`.
    pub async fn enqueue(&self, req: &Enqueue) -> EnqueueResult {
        self.enqueue_batch(std::slice::from_ref(req))
            .await?
            .pop()
            .unwrap_or_else(|| {
                Err(CoordinatorError::Internal(
                    "an enqueue batch of one item answered none".into(),
                ))
            })
    }

    /// Enqueues every item in one transaction and answers each in order,
    /// as [`enqueue`](Self::enqueue) would. An item naming a key an earlier
    /// item of the batch already named is answered against that item. The
    /// outer error is for the whole batch (nothing was written, or the
    /// commit's outcome is unknown).
    pub async fn enqueue_batch(
        &self,
        items: &[Enqueue],
    ) -> Result<Vec<EnqueueResult>, CoordinatorError> {
        let digests: Vec<[u8; 32]> = items
            .iter()
            .map(|r| call_digest(&[r.payload.as_bytes()]))
            .collect();
        // The first item naming each key decides it.
        let mut first: HashMap<(&str, &str), usize> = HashMap::new();
        let mut owners = Vec::with_capacity(items.len());
        for (i, r) in items.iter().enumerate() {
            owners.push(
                *first
                    .entry((r.queue.as_str(), r.operation_key.as_str()))
                    .or_insert(i),
            );
        }
        let mut distinct: Vec<usize> = first.values().copied().collect();
        // One order for every batch: concurrent batches insert keys in the
        // same order, which keeps their unique-key locks from deadlocking.
        distinct.sort_unstable_by(|&a, &b| {
            (&items[a].queue, &items[a].operation_key)
                .cmp(&(&items[b].queue, &items[b].operation_key))
        });
        let jobs = batch_transaction!(self, |tx| self.enqueue_in(tx, items, &digests, &distinct))?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let owner = owners[i];
                let (job, created, stored) = &jobs[&owner];
                if stored[..] != digests[i][..] {
                    Err(CoordinatorError::OperationKeyConflict {
                        queue: r.queue.clone(),
                        operation_key: r.operation_key.clone(),
                        job_id: job.id,
                    })
                } else {
                    Ok(EnqueueOutcome {
                        job: job.clone(),
                        // Only the item that inserted the row created it.
                        created: *created && owner == i,
                    })
                }
            })
            .collect())
    }

    /// One try: the job of each distinct item (by index), whether this
    /// transaction created it, and its stored digest.
    async fn enqueue_in(
        &self,
        tx: &mut Tx,
        items: &[Enqueue],
        digests: &[[u8; 32]],
        distinct: &[usize],
    ) -> Body<HashMap<usize, (Job, bool, [u8; 32])>> {
        let mut out = HashMap::with_capacity(distinct.len());
        if let Some(answered) = self.enqueue_unseen(tx, items, digests, distinct).await? {
            return Ok(answered);
        }
        // A large batch, or a key some job holds (the failed INSERT wrote
        // nothing): look the keys up, in the same transaction.
        let (live, pruned) = lookup_keys(tx, items, distinct).await?;
        for (i, (job, digest)) in live {
            out.insert(i, (job, false, digest));
        }
        // A key whose job was pruned answers as the job did (rule 14); a
        // key found in both (read while a pruner committed between the two
        // statements) is the live row's.
        for (i, (record, digest)) in pruned {
            out.entry(i)
                .or_insert_with(|| (record.as_enqueued_job(&items[i]), false, digest));
        }
        let new: Vec<usize> = distinct
            .iter()
            .copied()
            .filter(|i| !out.contains_key(i))
            .collect();
        if new.is_empty() {
            tx.rollback().await?;
            return Ok(out);
        }
        self.pause_in(PausePoint::EnqueueBeforeCommit, tx).await;
        let new_bytes: usize = new.iter().map(|&i| items[i].payload.len()).sum();
        if new_bytes <= INSERT_CHUNK_BYTES {
            for (i, (job, digest)) in insert_and_commit(tx, items, digests, &new).await? {
                out.insert(i, (job, true, digest));
            }
            return Ok(out);
        }
        insert(tx, items, digests, &new).await?;
        let inserted = by_keys(tx, items, &new).await?;
        if inserted.len() != new.len() {
            return Err(Failure::Error(CoordinatorError::Internal(format!(
                "inserted {} jobs but found {} of them",
                new.len(),
                inserted.len()
            ))));
        }
        let enqueued: Vec<NewEvent> = inserted
            .iter()
            .map(|(_, (job, _))| NewEvent {
                job_id: job.id,
                queue: &job.queue,
                attempt: 0,
                kind: jobfence_domain::EventKind::Enqueued,
                from_state: None,
                to_state: Some(JobState::Ready),
                current_attempt: 0,
                request_digest: None,
                detail: None,
                created_at: job.created_at,
            })
            .collect();
        events::append_and_commit(tx, &enqueued).await?;
        drop(enqueued);
        for (i, (job, digest)) in inserted {
            out.insert(i, (job, true, digest));
        }
        Ok(out)
    }
}

impl JobStore {
    /// The common case of a small batch: every key inserted at once (see
    /// [`insert_unseen_and_commit`]). `None` when the batch is large, or a
    /// key some job holds made the INSERT fail: nothing was written, and
    /// the caller looks the keys up in the same transaction.
    async fn enqueue_unseen(
        &self,
        tx: &mut Tx,
        items: &[Enqueue],
        digests: &[[u8; 32]],
        distinct: &[usize],
    ) -> Result<Option<HashMap<usize, (Job, bool, [u8; 32])>>, CoordinatorError> {
        let bytes: usize = distinct.iter().map(|&i| items[i].payload.len()).sum();
        if bytes > INSERT_CHUNK_BYTES {
            return Ok(None);
        }
        self.pause_in(PausePoint::EnqueueBeforeCommit, tx).await;
        match insert_unseen_and_commit(tx, items, digests, distinct).await? {
            Some(inserted) => Ok(Some(self.answer_unseen(items, distinct, inserted).await?)),
            None => Ok(None),
        }
    }

    /// The answers of a batch whose new items were inserted without a
    /// look-up ([`insert_unseen_and_commit`]): the inserted ones created,
    /// and the others, whose keys have key records (their jobs were
    /// pruned), answered as those jobs (docs/design.md rule 14), read
    /// after the COMMIT.
    async fn answer_unseen(
        &self,
        items: &[Enqueue],
        distinct: &[usize],
        inserted: Vec<(usize, (Job, [u8; 32]))>,
    ) -> Result<HashMap<usize, (Job, bool, [u8; 32])>, CoordinatorError> {
        let mut out: HashMap<usize, (Job, bool, [u8; 32])> = inserted
            .into_iter()
            .map(|(i, (job, digest))| (i, (job, true, digest)))
            .collect();
        let pruned: Vec<usize> = distinct
            .iter()
            .copied()
            .filter(|i| !out.contains_key(i))
            .collect();
        if pruned.is_empty() {
            return Ok(out);
        }
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        let (_, records) = lookup_keys(&mut conn, items, &pruned).await?;
        for (i, (record, digest)) in records {
            out.insert(i, (record.as_enqueued_job(&items[i]), false, digest));
        }
        match pruned.iter().find(|i| !out.contains_key(i)) {
            Some(&i) => Err(CoordinatorError::Internal(format!(
                "item {i} was neither inserted nor found in the key records"
            ))),
            None => Ok(out),
        }
    }
}

/// The common case of a small batch, in one round trip: insert every item
/// whose key has no key record (insert.sql with the key-record guard),
/// append their events, read them back and COMMIT. `Ok(None)` when a key
/// is held by a job (duplicate key): the INSERT failed before anything
/// was written, and the transaction stays open for the look-up path.
/// Other failures as for [`insert_and_commit`].
async fn insert_unseen_and_commit(
    tx: &mut Tx,
    items: &[Enqueue],
    digests: &[[u8; 32]],
    which: &[usize],
) -> Result<Option<Vec<(usize, (Job, [u8; 32]))>>, CoordinatorError> {
    insert_rows_and_commit(tx, items, digests, which, true).await
}

/// `json` as a SQL string literal.
fn json_literal(json: String) -> String {
    let mut s = String::new();
    literal::Literal::write_sql(json.as_str(), &mut s);
    s
}

/// Some items of a batch (`which` indexes `items`), as the statements
/// want them.
struct Picked<'a> {
    items: &'a [Enqueue],
    which: &'a [usize],
}

impl<'a> Picked<'a> {
    fn keys(&self) -> Vec<Key<'a>> {
        self.which
            .iter()
            .map(|&i| Key {
                queue: &self.items[i].queue,
                operation_key: &self.items[i].operation_key,
            })
            .collect()
    }

    fn new_rows(&self, digests: &[[u8; 32]]) -> Vec<NewRow<'a>> {
        self.which
            .iter()
            .map(|&i| NewRow {
                queue: &self.items[i].queue,
                operation_key: &self.items[i].operation_key,
                request_digest: hex(&digests[i]),
                payload: &self.items[i].payload,
                delay_us: micros(self.items[i].delay),
                priority: self.items[i].priority.get(),
                fairness_key: self.items[i].fairness_key.as_deref().unwrap_or(""),
            })
            .collect()
    }

    /// A row read back by key: the item it answers, its job and digest.
    fn found(&self, row: &MySqlRow) -> Result<(usize, (Job, [u8; 32])), CoordinatorError> {
        let job = rows::job(row)?;
        let digest = unhex32(&rows::text(row, "request_digest_hex")?)?;
        let i = self
            .which
            .iter()
            .copied()
            .find(|&i| {
                self.items[i].queue == job.queue && self.items[i].operation_key == job.operation_key
            })
            .ok_or_else(|| {
                CoordinatorError::Internal(format!("job {} matches no key asked", job.id))
            })?;
        Ok((i, (job, digest)))
    }
}

/// The existing jobs among `which` items, by item index.
async fn by_keys(
    conn: &mut MySqlConnection,
    items: &[Enqueue],
    which: &[usize],
) -> Result<Vec<(usize, (Job, [u8; 32]))>, CoordinatorError> {
    let picked = Picked { items, which };
    let found = sqlx::query(&BY_KEYS)
        .bind(json(&picked.keys())?)
        .fetch_all(conn)
        .await
        .map_err(convert_sqlx_err)?;
    found.iter().map(|row| picked.found(row)).collect()
}

/// The jobs among `which` items, and the key records of pruned jobs among
/// them, by item index, in one round trip: the jobs first, then
/// `operation_keys`. Under READ COMMITTED each statement reads what was
/// committed when it began, and a pruner writes a key record in the
/// transaction that deletes its job, so a key read as absent from `jobs`
/// by the first statement is found by the second if it was pruned.
async fn lookup_keys(
    conn: &mut MySqlConnection,
    items: &[Enqueue],
    which: &[usize],
) -> Result<(FoundJobs, FoundRecords), CoordinatorError> {
    use sqlx::Row;
    use tokio_stream::StreamExt;
    let picked = Picked { items, which };
    let mut keys_literal = String::new();
    literal::Literal::write_sql(json(&picked.keys())?.as_str(), &mut keys_literal);
    let text = [
        with_literal(&BY_KEYS, &keys_literal),
        with_literal(include_str!("queries/retention/by_keys.sql"), &keys_literal),
    ]
    .join(";\n");
    let (mut live, mut pruned) = (Vec::new(), Vec::new());
    let mut results = sqlx::raw_sql(&text).fetch_many(&mut *conn);
    while let Some(item) = results.next().await {
        let Some(row) = item.map_err(convert_sqlx_err)?.right() else {
            continue;
        };
        if row.try_column("final_state").is_err() {
            live.push(picked.found(&row)?);
            continue;
        }
        let record = super::retention::key_record(&row)?;
        let digest = unhex32(&rows::text(&row, "request_digest_hex")?)?;
        let i = which
            .iter()
            .copied()
            .find(|&i| {
                items[i].queue == record.queue && items[i].operation_key == record.operation_key
            })
            .ok_or_else(|| {
                CoordinatorError::Internal(format!("key record {} matches no key", record.job_id))
            })?;
        pruned.push((i, (record, digest)));
    }
    Ok((live, pruned))
}

type FoundJobs = Vec<(usize, (Job, [u8; 32]))>;
type FoundRecords = Vec<(usize, (jobfence_domain::KeyRecord, [u8; 32]))>;

/// Inserts the `which` items, appends their events, reads them back and
/// commits, in one round trip (a text query: the batch travels as JSON in
/// a hex literal, see `literal`). The items' keys were free when looked
/// up; a concurrent Enqueue that took one since makes the insert fail
/// (duplicate key) and the batch run again.
async fn insert_and_commit(
    tx: &mut Tx,
    items: &[Enqueue],
    digests: &[[u8; 32]],
    which: &[usize],
) -> Result<Vec<(usize, (Job, [u8; 32]))>, CoordinatorError> {
    let found = insert_rows_and_commit(tx, items, digests, which, false).await?;
    let found = found.ok_or_else(|| CoordinatorError::Internal("an unguarded insert".into()))?;
    if found.len() != which.len() {
        return Err(CoordinatorError::Internal(format!(
            "inserted {} jobs but found {} of them",
            which.len(),
            found.len()
        )));
    }
    Ok(found)
}

/// The one round trip of an insert: the queues' frontiers, the INSERT of
/// the `which` items
/// (`unseen`: without a look-up first, skipping keys with a key record,
/// and `Ok(None)` when a key some job holds fails it before anything was
/// written; else a duplicate key is a `TransactionConflict`), their
/// fairness keys' last rounds (docs/design.md rule 18), their events, their rows read back, and COMMIT. The server refusing a
/// statement before COMMIT is its own error; a failure of COMMIT, or of
/// the connection with COMMIT sent, leaves the outcome unknown.
async fn insert_rows_and_commit(
    tx: &mut Tx,
    items: &[Enqueue],
    digests: &[[u8; 32]],
    which: &[usize],
    unseen: bool,
) -> Result<Option<Vec<(usize, (Job, [u8; 32]))>>, CoordinatorError> {
    use tokio_stream::StreamExt;
    let picked = Picked { items, which };
    let rows_json = json_literal(json(&picked.new_rows(digests))?);
    let keys_json = json_literal(json(&picked.keys())?);
    let guard = if unseen { KEY_RECORD_GUARD } else { "" };
    let text = [
        with_literal(include_str!("queries/enqueue/frontiers.sql"), &rows_json),
        with_literal(include_str!("queries/enqueue/insert.sql"), &rows_json)
            .replace("{guard}", guard),
        with_literal(
            include_str!("queries/enqueue/fairness_keys.sql"),
            &keys_json,
        ),
        with_literal(include_str!("queries/enqueue/events.sql"), &keys_json),
        with_literal(&BY_KEYS, &keys_json),
        "COMMIT".to_owned(),
    ]
    .join(";\n");
    let mut found = Vec::with_capacity(which.len());
    let mut statements_done = 0;
    let mut results = sqlx::raw_sql(&text).fetch_many(&mut **tx);
    while let Some(item) = results.next().await {
        match item {
            Ok(sqlx::Either::Left(_)) => statements_done += 1,
            Ok(sqlx::Either::Right(row)) => found.push(picked.found(&row)?),
            // A key some job holds: nothing was written.
            Err(e) if is_unique_violation(&e) && unseen && statements_done == 1 => return Ok(None),
            // Taken by a concurrent Enqueue since we looked: run again.
            Err(e) if is_unique_violation(&e) => {
                return Err(CoordinatorError::TransactionConflict(e.to_string()))
            }
            // The server refused a statement before COMMIT: COMMIT never ran.
            Err(e @ sqlx::Error::Database(_)) if statements_done < 5 => {
                return Err(convert_sqlx_err(e))
            }
            Err(e @ sqlx::Error::Database(_)) => return Err(convert_commit_err(e)),
            // The connection failed with COMMIT sent: it may have run.
            Err(e) => return Err(CoordinatorError::CommitOutcomeUnknown(e.to_string())),
        }
    }
    drop(results);
    if statements_done < 6 {
        return Err(CoordinatorError::CommitOutcomeUnknown(
            "the enqueue batch ended before its COMMIT answered".into(),
        ));
    }
    tx.committed();
    Ok(Some(found))
}

/// The condition that leaves out of an unseen insert the keys with a key
/// record (their jobs were pruned; docs/design.md rule 14).
const KEY_RECORD_GUARD: &str =
    "WHERE NOT EXISTS (SELECT 1 FROM operation_keys k FORCE INDEX (PRIMARY) \
     WHERE k.queue = t.queue AND k.operation_key = t.operation_key)";

/// `sql` with its one placeholder replaced by `literal`.
fn with_literal(sql: &str, literal: &str) -> String {
    debug_assert_eq!(sql.matches('?').count(), 1, "{sql}");
    sql.replacen('?', literal, 1)
}

/// Inserts the `which` items, in statements of at most
/// [`INSERT_CHUNK_BYTES`] of payload.
async fn insert(
    conn: &mut MySqlConnection,
    items: &[Enqueue],
    digests: &[[u8; 32]],
    which: &[usize],
) -> Result<(), CoordinatorError> {
    let rows = Picked { items, which }.new_rows(digests);
    let mut chunk: Vec<&NewRow> = Vec::new();
    let mut bytes = 0;
    for (n, row) in rows.iter().enumerate() {
        bytes += row.payload.len() + row.operation_key.len();
        chunk.push(row);
        if bytes >= INSERT_CHUNK_BYTES || n + 1 == rows.len() {
            // As text: MariaDB does not resolve the frontiers' correlated
            // subqueries in a prepared statement. Each chunk records its
            // lines' last rounds before the next chunk starts from them.
            let rows = json_literal(json(&chunk)?);
            let keys: Vec<Key> = chunk
                .iter()
                .map(|r| Key {
                    queue: r.queue,
                    operation_key: r.operation_key,
                })
                .collect();
            let text = [
                with_literal(include_str!("queries/enqueue/frontiers.sql"), &rows),
                with_literal(&INSERT_LOOKED_UP, &rows),
                with_literal(
                    include_str!("queries/enqueue/fairness_keys.sql"),
                    &json_literal(json(&keys)?),
                ),
            ]
            .join(";\n");
            let done = super::batch::result_sets_raw(&mut *conn, &text).await;
            match done {
                Ok(_) => {}
                // Taken by a concurrent Enqueue since we looked: run again.
                Err(e) if is_unique_violation(&e) => {
                    return Err(CoordinatorError::TransactionConflict(e.to_string()))
                }
                Err(e) => return Err(convert_sqlx_err(e)),
            }
            chunk.clear();
            bytes = 0;
        }
    }
    Ok(())
}

fn unhex32(s: &str) -> Result<[u8; 32], CoordinatorError> {
    let bad = || CoordinatorError::Internal(format!("unreadable request digest {s:?}"));
    if s.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}
