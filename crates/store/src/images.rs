//! The new images of a batch's jobs as SQL text, to travel with the
//! transaction's COMMIT: the same fenced UPDATE as
//! [`batch::write_images`](crate::batch::write_images) (the statement of
//! `queries/batch/write_images.sql`, its values as literals), followed by
//! a check that every row matched. A lone worker's job then costs one
//! round trip less: its write, its events and its COMMIT go together.
//!
//! The check is what `write_images` does in Rust after its UPDATE: every
//! fenced row must match, since the caller holds every row's lock
//! (docs/design.md rule 3). Here the COMMIT is already on its way, so the
//! check runs in the server, between the UPDATE and the COMMIT: a
//! `SELECT` whose unsigned sum overflows (error 1690, on MySQL and MariaDB
//! alike) unless `ROW_COUNT()` (matched rows: sqlx connects with
//! CLIENT_FOUND_ROWS, rule 10) equals the number of images. A failed
//! statement ends the server's run of the text, so the COMMIT never runs;
//! the caller reports the check's failure as a conflict
//! ([`ImagesText::conflict`]), rolled back and run again from the start.

use crate::batch::{check_images, Change};
use crate::literal::{self, Literal};
use jobfence_domain::{CoordinatorError, Job};
use std::sync::LazyLock;

/// Writes one column's new value of a job as a literal.
type Column = dyn Fn(&Job, &mut String);

/// The UPDATE of a batch's images and its check, as text.
pub(crate) struct ImagesText {
    /// The fenced UPDATE, every value a literal.
    pub update: String,
    /// The statement that fails unless the UPDATE matched every row.
    pub check: String,
    rows: usize,
}

impl ImagesText {
    /// What a failed check means: a row that changed under its lock (a
    /// bug, or a schema the code does not know), the same conflict as
    /// `write_images` reports.
    pub(crate) fn conflict(&self) -> CoordinatorError {
        CoordinatorError::TransactionConflict(format!(
            "fewer than {} fenced rows matched under their row locks",
            self.rows
        ))
    }
}

/// The text of `changes`' UPDATE and its check; `None` when there is
/// nothing to write. A change that moves an id or skips an attempt is
/// refused `Internal`, as by `write_images`.
pub(crate) fn images_text(changes: &[Change<'_>]) -> Result<Option<ImagesText>, CoordinatorError> {
    if changes.is_empty() {
        return Ok(None);
    }
    check_images(changes)?;
    static UPDATE: LazyLock<String> =
        LazyLock::new(|| literal::bare(include_str!("queries/batch/write_images.sql")));
    let mut update = UPDATE.clone();
    // One CASE per column, in the statement's order.
    let columns: [&Column; 14] = [
        &|a, out| a.state.as_str().write_sql(out),
        &|a, out| a.attempt.write_sql(out),
        &|a, out| a.next_action.as_str().write_sql(out),
        &|a, out| a.run_at.write_sql(out),
        &|a, out| a.lease_until.as_ref().write_sql(out),
        &|a, out| a.lease_owner.as_deref().write_sql(out),
        &|a, out| a.first_dispatched_at.as_ref().write_sql(out),
        &|a, out| a.dispatch_count.write_sql(out),
        &|a, out| a.provider_reference.as_deref().write_sql(out),
        &|a, out| a.result.as_deref().write_sql(out),
        &|a, out| a.last_error.as_deref().write_sql(out),
        &|a, out| a.state_reason.as_deref().write_sql(out),
        &|a, out| a.updated_at.write_sql(out),
        &|a, out| a.finished_at.as_ref().write_sql(out),
    ];
    for value in columns {
        let mut cases = String::new();
        for c in changes {
            cases.push_str(if cases.is_empty() { "WHEN " } else { " WHEN " });
            c.after.id.write_sql(&mut cases);
            cases.push_str(" THEN ");
            value(c.after, &mut cases);
        }
        update = update.replacen("{cases}", &cases, 1);
    }
    let mut ids = String::new();
    let mut fences = String::new();
    for c in changes {
        if !ids.is_empty() {
            ids.push_str(", ");
            fences.push_str(", ");
        }
        c.before.id.write_sql(&mut ids);
        let b = c.before;
        crate::literal::tuple(&mut fences, &[&b.id, &b.state.as_str(), &b.attempt]);
    }
    let update = update.replace("{ids}", &ids).replace("{fences}", &fences);
    let check = format!(
        "SELECT 18446744073709551615 + (ROW_COUNT() <> {}) AS every_image_matched",
        changes.len()
    );
    Ok(Some(ImagesText {
        update,
        check,
        rows: changes.len(),
    }))
}

#[cfg(feature = "testsuite")]
impl crate::JobStore {
    /// Writes job `job_id`'s row back with `state_reason` set to `reason`,
    /// through the images-with-COMMIT path, fenced on `fence` as the row's
    /// state: a fence the row does not have must be refused by the check
    /// (`TransactionConflict`, nothing committed). For tests of the check:
    /// under a row lock a fence cannot fail otherwise.
    pub async fn write_image_fenced_on(
        &self,
        job_id: u64,
        fence: jobfence_domain::JobState,
        reason: &str,
    ) -> Result<(), CoordinatorError> {
        let mut tx = self.begin_batch().await?;
        let locked = crate::batch::lock_jobs(&mut tx, &[job_id])
            .await?
            .remove(&job_id)
            .ok_or(CoordinatorError::JobNotFound { job_id })?;
        let before = Job {
            state: fence,
            ..locked.job.clone()
        };
        let after = Job {
            state_reason: Some(reason.into()),
            ..locked.job
        };
        let changes = [Change {
            before: &before,
            after: &after,
        }];
        crate::events::write_append_and_commit(tx, &changes, &[], &[]).await
    }
}
