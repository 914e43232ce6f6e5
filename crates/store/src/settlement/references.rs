//! A report line that names no operation key (a refund made by hand, a
//! Stripe refund without the metadata key) is matched by the provider's
//! reference recorded on a job, or on a pruned job's key record
//! (docs/design.md rule 15): this is that lookup, through the index on
//! `(queue, provider_reference)` of `jobs` and of `operation_keys`.

use super::json_list;
use crate::convert_sqlx_err;
use crate::rows::{get, text};
use jobfence_domain::settlement::records::QueueAmounts;
use jobfence_domain::CoordinatorError;
use sqlx::MySqlConnection;
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

/// Who recorded a provider reference: a job, or a pruned job's key record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByReference {
    /// The job's queue (one of the provider's).
    pub queue: String,
    /// Its operation key.
    pub operation_key: String,
    /// The job's id (a key record keeps its pruned job's).
    pub job_id: u64,
    /// A key record, not a job.
    pub pruned: bool,
}

/// The holder of each of `references` among the provider's `queues`, by
/// reference: a job before a key record, and of two jobs the oldest (a
/// reference recorded twice is a worker's mistake; the report then names
/// the key of the first job that recorded it). References nobody recorded
/// are absent. One statement on `conn`, whose reads are one index lookup
/// per (queue, reference): the rows it finds, whatever the number of jobs
/// of the queues.
pub async fn keys_by_reference(
    conn: &mut MySqlConnection,
    queues: &[QueueAmounts],
    references: &[&str],
) -> Result<BTreeMap<String, ByReference>, CoordinatorError> {
    let mut out = BTreeMap::new();
    if references.is_empty() || queues.is_empty() {
        return Ok(out);
    }
    let names: Vec<&str> = queues.iter().map(|q| q.queue.as_str()).collect();
    let (queues, references) = (json_list(&names)?, json_list(references)?);
    let rows = sqlx::query(include_str!("../queries/settlement/keys_by_reference.sql"))
        .bind(&queues)
        .bind(&references)
        .bind(&queues)
        .bind(&references)
        .fetch_all(conn)
        .await
        .map_err(convert_sqlx_err)?;
    let mut rank: BTreeMap<String, (u8, u64)> = BTreeMap::new();
    for row in &rows {
        let reference = text(row, "provider_reference")?;
        let src: i64 = get(row, "src")?;
        let found = ByReference {
            queue: text(row, "queue")?,
            operation_key: text(row, "operation_key")?,
            job_id: get(row, "job_id")?,
            pruned: src != 0,
        };
        let order = (u8::from(found.pruned), found.job_id);
        match rank.entry(reference.clone()) {
            Entry::Occupied(e) if *e.get() <= order => continue,
            Entry::Occupied(mut e) => {
                e.insert(order);
            }
            Entry::Vacant(e) => {
                e.insert(order);
            }
        }
        out.insert(reference, found);
    }
    Ok(out)
}
