//! PauseQueue and ResumeQueue: an operator holds a queue's claims, with or
//! without a provider, on every coordinator (the pause is stored in the
//! queue's row, which each claim reads in its transaction:
//! crates/store/src/queue_pause.rs). Its ready jobs stay ready; a purge is
//! a bulk cancel (`jobfence jobs bulk cancel --queue Q`).

use super::Coordinator;
use jobfence_domain::providers::ChangeBy;
use jobfence_domain::validate::Violations;
use jobfence_domain::CoordinatorError;
use jobfence_store::queue_pause::QueuePause;

impl Coordinator {
    /// Pauses `queue`: from the next claim on, on every coordinator, its
    /// claims hand out nothing (a long poll waits its whole wait) until it
    /// is resumed. `InvalidArgument` for a bad queue name, no operator or
    /// no reason.
    pub async fn pause_queue(&self, queue: &str, by: ChangeBy) -> Result<(), CoordinatorError> {
        let mut v = Violations::default();
        v.queue("queue", queue);
        super::providers::check_by(&mut v, &by);
        v.finish()?;
        let store = self.shards().at(self.shards().index_for_queue(queue)?);
        store.pause_queue(queue, &by).await?;
        tracing::warn!(
            queue = %queue,
            operator = %by.operator.escape_debug(),
            reason = %by.reason.escape_debug(),
            "queue paused: its claims hand out nothing until it is resumed"
        );
        Ok(())
    }

    /// Resumes `queue`; `false` when it was not paused.
    pub async fn resume_queue(&self, queue: &str, by: ChangeBy) -> Result<bool, CoordinatorError> {
        let mut v = Violations::default();
        v.queue("queue", queue);
        super::providers::check_by(&mut v, &by);
        v.finish()?;
        let store = self.shards().at(self.shards().index_for_queue(queue)?);
        let resumed = store.resume_queue(queue, &by).await?;
        if resumed {
            tracing::warn!(
                queue = %queue,
                operator = %by.operator.escape_debug(),
                reason = %by.reason.escape_debug(),
                "queue resumed"
            );
        }
        Ok(resumed)
    }

    /// The paused queues of every database, by name.
    pub async fn paused_queues(&self) -> Result<Vec<QueuePause>, CoordinatorError> {
        let mut out = Vec::new();
        for (_, store) in self.shards().all() {
            out.extend(store.paused_queues().await?);
        }
        out.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(out)
    }
}
