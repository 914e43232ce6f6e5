//! BulkRepair: an operator's cancel, fail or requeue of many counted jobs,
//! one transaction per database (the store's `bulk_repair`), each job
//! fenced on the attempt the count saw and decided by its single call's
//! rule (docs/design.md rules 3 and 8). The request limits, then the
//! store, then the metrics and one log line per call.

use super::Coordinator;
use jobfence_domain::admin::{
    fence, BulkAction, BulkJobResult, BulkRepair, BulkRepairOutcome, CountedJob, MAX_BULK_JOBS,
};
use jobfence_domain::scope::ANY_QUEUE;
use jobfence_domain::validate::Violations;
use jobfence_domain::CoordinatorError;
use std::collections::{BTreeMap, HashSet};

/// The violations of a BulkRepair's jobs: at least one, at most
/// [`MAX_BULK_JOBS`], none twice, each a job id, and for the resolutions
/// an attempt (a parked job was claimed at least once).
fn check_jobs(v: &mut Violations, action: BulkAction, jobs: &[CountedJob]) {
    if jobs.is_empty() {
        v.add("jobs", "must name at least one job");
        return;
    }
    if jobs.len() > MAX_BULK_JOBS {
        v.add(
            "jobs",
            format!(
                "names {} jobs, more than {MAX_BULK_JOBS}: send them in batches",
                jobs.len()
            ),
        );
        return;
    }
    let mut seen = HashSet::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        if j.job_id == 0 {
            v.add(
                &format!("jobs[{i}].job_id"),
                "is required (job ids start at 1)",
            );
        } else if !seen.insert(j.job_id) {
            v.add(
                &format!("jobs[{i}].job_id"),
                format!("names job {} a second time", j.job_id),
            );
        }
        if j.attempt == 0 && action != BulkAction::Cancel {
            v.add(
                &format!("jobs[{i}].attempt"),
                "is required: a parked job was claimed at least once",
            );
        }
    }
}

impl Coordinator {
    /// BulkRepair: `req.action` on each of `req.jobs`, fenced on its
    /// counted attempt. Refused as a whole, nothing written, with
    /// `InvalidArgument` for bad input (an operator or reason missing, no
    /// job or more than [`MAX_BULK_JOBS`], a job named twice, a job id of
    /// 0, an attempt of 0 for `fail` or `requeue`). Otherwise answers each
    /// job in the order of the call: applied (or a replay of the same
    /// action applied before), or the refusal its single call would get:
    /// `JobNotCancellable`, `JobNotInManualReview`, `AttemptSuperseded`
    /// when it moved since the count (skipped), `AttemptNotIssued`,
    /// `JobNotFound` / `JobPruned`. The jobs of one database share one
    /// transaction; when it fails as a whole (a conflict past the retries,
    /// the database unavailable, a COMMIT whose outcome is unknown), each
    /// of its jobs is answered with that error.
    pub async fn bulk_repair(
        &self,
        req: BulkRepair,
    ) -> Result<BulkRepairOutcome, CoordinatorError> {
        let mut v = Violations::default();
        super::admin::operator_fields(&mut v, &req.operator, &req.reason);
        check_jobs(&mut v, req.action, &req.jobs);
        v.finish()?;
        let mut by_database: BTreeMap<usize, Vec<CountedJob>> = BTreeMap::new();
        let mut answers: BTreeMap<u64, BulkJobResult> = BTreeMap::new();
        for j in &req.jobs {
            match self.shards().index_for_id(j.job_id) {
                Ok(i) => by_database.entry(i).or_default().push(*j),
                Err(e) => {
                    answers.insert(j.job_id, Err(e));
                }
            }
        }
        let mut conflicts_retried = 0;
        for (i, jobs) in by_database {
            let part = BulkRepair {
                jobs,
                action: req.action,
                operator: req.operator.clone(),
                reason: req.reason.clone(),
            };
            match self.shards().at(i).bulk_repair(&part).await {
                Ok((results, retried)) => {
                    conflicts_retried += retried;
                    for (j, r) in part.jobs.iter().zip(results) {
                        answers.insert(j.job_id, r);
                    }
                }
                Err(e) => {
                    self.metrics().commit_outcome("BulkRepair", &e);
                    for j in &part.jobs {
                        answers.insert(j.job_id, Err(e.clone()));
                    }
                }
            }
        }
        let mut results = Vec::with_capacity(req.jobs.len());
        for j in &req.jobs {
            let answer = match answers.remove(&j.job_id) {
                Some(Err(e @ CoordinatorError::JobNotFound { .. })) => {
                    Err(self.explain(e, &ANY_QUEUE).await)
                }
                Some(a) => a,
                None => Err(CoordinatorError::Internal(format!(
                    "job {} of a bulk repair got no answer",
                    j.job_id
                ))),
            };
            results.push((j.job_id, answer));
        }
        let outcome = BulkRepairOutcome {
            results,
            conflicts_retried,
        };
        self.count_bulk(&req, &outcome);
        Ok(outcome)
    }

    /// The metrics of the jobs applied (those of their single calls:
    /// cancellations, resolutions) and one log line for the call; each
    /// job's own record is its event.
    fn count_bulk(&self, req: &BulkRepair, outcome: &BulkRepairOutcome) {
        let resolution = req.action.resolution();
        let mut errors = 0;
        for (_, r) in &outcome.results {
            match r {
                Ok(a) if !a.replayed => match &resolution {
                    None => self.metrics().cancellation(&a.queue),
                    Some(r) => self.metrics().resolution(&a.queue, r.as_str()),
                },
                Ok(_) => {}
                Err(e) if !fence::moved(e) => errors += 1,
                Err(_) => {}
            }
        }
        tracing::warn!(
            action = req.action.as_str(),
            jobs = req.jobs.len(),
            applied = outcome.applied(),
            skipped = outcome.skipped(),
            errors,
            conflicts_retried = outcome.conflicts_retried,
            first_job_id = req.jobs.first().map_or(0, |j| j.job_id),
            operator = %req.operator.escape_debug(),
            reason = %req.reason.escape_debug(),
            "jobs repaired in bulk by operator"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(pairs: &[(u64, u64)]) -> Vec<CountedJob> {
        pairs
            .iter()
            .map(|&(job_id, attempt)| CountedJob { job_id, attempt })
            .collect()
    }

    fn fields(action: BulkAction, j: &[CountedJob]) -> Vec<String> {
        let mut v = Violations::default();
        check_jobs(&mut v, action, j);
        v.0.into_iter().map(|f| f.field).collect()
    }

    #[test]
    fn a_bulk_names_each_bad_job_by_its_place() {
        assert!(fields(BulkAction::Cancel, &jobs(&[(1, 0), (2, 3)])).is_empty());
        assert_eq!(fields(BulkAction::Cancel, &[]), ["jobs"]);
        assert_eq!(
            fields(BulkAction::Cancel, &jobs(&[(1, 0), (0, 0), (1, 0)])),
            ["jobs[1].job_id", "jobs[2].job_id"]
        );
        assert_eq!(
            fields(BulkAction::Requeue, &jobs(&[(1, 1), (2, 0)])),
            ["jobs[1].attempt"]
        );
        let many: Vec<(u64, u64)> = (1..=MAX_BULK_JOBS as u64 + 1).map(|i| (i, 0)).collect();
        assert_eq!(fields(BulkAction::Fail, &jobs(&many)), ["jobs"]);
        let most: Vec<(u64, u64)> = (1..=MAX_BULK_JOBS as u64).map(|i| (i, 1)).collect();
        assert!(fields(BulkAction::Fail, &jobs(&most)).is_empty());
    }
}
