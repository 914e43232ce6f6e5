//! Enqueue and EnqueueBatch: validation, one transaction per database,
//! and waking the long-polling Claims of a new job's queue.

use super::Coordinator;
use jobfence_domain::validate::{Violations, MAX_BODY_BYTES};
use jobfence_domain::{CoordinatorError, Enqueue, EnqueueOutcome, QueueScope};

impl Coordinator {
    /// Enqueue; see [`JobStore::enqueue`]. Concurrent Enqueues share one
    /// transaction. `QueueNotAllowed` when `scope` does not cover the
    /// queue (after validation; nothing written).
    pub async fn enqueue(
        &self,
        req: Enqueue,
        scope: &QueueScope,
    ) -> Result<EnqueueOutcome, CoordinatorError> {
        let mut v = Violations::default();
        check_enqueue(&mut v, "", &req);
        v.finish()?;
        scope.check(&req.queue, None)?;
        let out = self
            .for_queue(&req.queue)?
            .enqueues
            .submit(req)
            .await
            .and_then(|r| r)
            .inspect_err(|e| self.metrics.commit_outcome("Enqueue", e))?;
        self.enqueued(&out);
        tracing::debug!(job_id = out.job.id, created = out.created, "enqueued");
        Ok(out)
    }

    /// EnqueueBatch: every item is checked first, and a batch with any bad
    /// item is refused whole (INVALID_ARGUMENT naming `items[i].field` for
    /// each problem; nothing written). Otherwise one transaction per
    /// database its queues live on, and each item gets its own answer, as a
    /// single Enqueue would (created, the same request again, or
    /// `OperationKeyConflict`). A batch with any item outside `scope` is
    /// refused whole (`QueueNotAllowed`, nothing written). With several databases an outer error
    /// (nothing written, or the commit's outcome unknown) is that of the
    /// first database that failed; the others' items may have been
    /// written, and an Enqueue again is answered `created=false`.
    pub async fn enqueue_batch(
        &self,
        items: Vec<Enqueue>,
        scope: &QueueScope,
    ) -> Result<Vec<Result<EnqueueOutcome, CoordinatorError>>, CoordinatorError> {
        let mut v = Violations::default();
        self.check_enqueue_batch(&items, &mut v);
        let mut by_database: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, item) in items.iter().enumerate() {
            match self.shards.index_for_queue(&item.queue) {
                Ok(d) => by_database.entry(d).or_default().push(i),
                Err(CoordinatorError::InvalidArgument(why)) => {
                    for f in why {
                        v.add(&format!("items[{i}].{}", f.field), f.description);
                    }
                }
                Err(other) => return Err(other),
            }
        }
        v.finish()?;
        for item in &items {
            scope.check(&item.queue, None)?;
        }
        let mut answers: Vec<Option<Result<EnqueueOutcome, CoordinatorError>>> =
            (0..items.len()).map(|_| None).collect();
        let mut failed = None;
        for (d, which) in by_database {
            let part: Vec<Enqueue> = which.iter().map(|&i| items[i].clone()).collect();
            match self.shards.at(d).enqueue_batch(&part).await {
                Ok(done) => {
                    for (i, answer) in which.into_iter().zip(done) {
                        answers[i] = Some(answer);
                    }
                }
                Err(e) => {
                    self.metrics.commit_outcome("EnqueueBatch", &e);
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let answers: Vec<_> = answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(CoordinatorError::Unanswered { what: "enqueue" })))
            .collect();
        for out in answers.iter().flatten() {
            self.enqueued(out);
        }
        Ok(answers)
    }

    /// Adds the limits an EnqueueBatch of `items` breaks to `v` (fields
    /// named `items[i].field`).
    pub fn check_enqueue_batch(&self, items: &[Enqueue], v: &mut Violations) {
        if items.is_empty() {
            v.add("items", "must hold at least one item");
        } else if items.len() > self.config.max_enqueue_batch {
            v.add(
                "items",
                format!(
                    "must hold at most {} items (got {})",
                    self.config.max_enqueue_batch,
                    items.len()
                ),
            );
        }
        for (i, item) in items.iter().enumerate() {
            check_enqueue(v, &format!("items[{i}]."), item);
        }
    }

    /// Wakes long-polling Claims of a new job's queue when it is due.
    fn enqueued(&self, out: &EnqueueOutcome) {
        if out.created {
            let due = (out.job.run_at - out.job.created_at)
                .to_std()
                .unwrap_or_default();
            self.pipelines.waiters.due_in(&out.job.queue, due);
        }
    }
}

/// The limits of one Enqueue; `prefix` names the item in a batch
/// (`items[3].`).
fn check_enqueue(v: &mut Violations, prefix: &str, req: &Enqueue) {
    v.queue(&format!("{prefix}queue"), &req.queue);
    v.unique_key(&format!("{prefix}operation_key"), &req.operation_key);
    v.max_bytes(&format!("{prefix}payload"), &req.payload, MAX_BODY_BYTES);
    v.delay(&format!("{prefix}delay"), req.delay);
}
