//! [`Enqueue`]: a job to add, with its options (a delay, a fairness key, a
//! priority), and [`WorkerClient::enqueue`] / [`WorkerClient::enqueue_batch`],
//! which add it. Enqueue is idempotent on (queue, operation key), so both
//! are retried like a write.

use super::client::{proto_duration, WorkerClient};
use super::error::{self, WriteError};
use crate::proto::{self, EnqueueBatchRequest, EnqueueRequest};
use std::time::Duration;

/// A job to add: its queue, its operation key (the provider's idempotency
/// key, unique in the queue) and its opaque payload, then the options,
/// each left at the coordinator's default unless set:
///
/// ```
/// # use std::time::Duration;
/// let job = jobfence_worker::Enqueue::new("refunds", "refund-pay_1-500-TWD", "{}")
///     .fairness_key("merchant-7")
///     .priority(7)
///     .delay(Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueue {
    request: EnqueueRequest,
}

impl Enqueue {
    /// A job of `queue` under `operation_key` carrying `payload`, due at
    /// once, without a fairness key, at the default priority (5).
    pub fn new(
        queue: impl Into<String>,
        operation_key: impl Into<String>,
        payload: impl Into<String>,
    ) -> Self {
        Enqueue {
            request: EnqueueRequest {
                queue: queue.into(),
                operation_key: operation_key.into(),
                payload: payload.into(),
                ..EnqueueRequest::default()
            },
        }
    }

    /// Due this long from now instead of at once (zero: at once).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.request.delay = (!delay.is_zero()).then(|| proto_duration(delay));
        self
    }

    /// Among whose jobs claims go round-robin within the queue and the
    /// priority (a merchant, a tenant; at most 128 bytes, not blank):
    /// docs/design.md rule 18. Jobs without one share one key.
    pub fn fairness_key(mut self, key: impl Into<String>) -> Self {
        self.request.fairness_key = key.into();
        self
    }

    /// 1 (lowest) to 9 (most urgent); 0 asks for the default, 5. Each step
    /// moves the job 100 rounds of the fair order ahead or back (rule 18).
    /// Outside 0..=9 the coordinator refuses it ([`WriteError::Invalid`],
    /// field `priority`).
    pub fn priority(mut self, priority: u32) -> Self {
        self.request.priority = priority;
        self
    }
}

impl From<Enqueue> for EnqueueRequest {
    /// The request as sent (for a caller of the raw `proto` client).
    fn from(job: Enqueue) -> Self {
        job.request
    }
}

/// An applied Enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueued {
    /// The job as stored: its id, and the priority and fairness key it was
    /// given (`job.priority`, `job.fairness_key`). For a repeat, the job
    /// the first call added.
    pub job: proto::Job,
    /// False when a job of this queue and operation key already existed
    /// with the same payload: nothing was added.
    pub created: bool,
}

impl WorkerClient {
    /// Adds a job, idempotent on (queue, operation key): the same request
    /// again answers with the existing job and `created: false`; the same
    /// key with another payload is refused (`OPERATION_KEY_CONFLICT`, as
    /// [`WriteError::Other`]). A blank or too long fairness key, or a
    /// priority above 9, is [`WriteError::Invalid`] naming the field.
    /// Retried like a write (a repeat is answered with the job the lost
    /// call added).
    pub async fn enqueue(&self, job: Enqueue) -> Result<Enqueued, WriteError> {
        let message = EnqueueRequest::from(job);
        let response = self
            .retrying(error::retryable_write, || {
                let mut rpc = self.rpc.clone();
                let request = self.request(message.clone());
                async move { self.deadline(rpc.enqueue(request)).await }
            })
            .await
            .map_err(error::write_error)?
            .into_inner();
        let job = response.job.ok_or_else(|| {
            WriteError::Other(Box::new(tonic::Status::internal(
                "enqueue response without a job",
            )))
        })?;
        Ok(Enqueued {
            job,
            created: response.created,
        })
    }

    /// Adds `jobs` in one transaction: one result per job, in order, each
    /// an applied enqueue or the refusal of that job alone (a field of
    /// job `i` is named `items[i].…`). Retried like
    /// [`enqueue`](Self::enqueue).
    pub async fn enqueue_batch(
        &self,
        jobs: impl IntoIterator<Item = Enqueue>,
    ) -> Result<Vec<proto::EnqueueBatchResult>, WriteError> {
        let message = EnqueueBatchRequest {
            items: jobs.into_iter().map(EnqueueRequest::from).collect(),
        };
        let response = self
            .retrying(error::retryable_write, || {
                let mut rpc = self.rpc.clone();
                let request = self.request(message.clone());
                async move { self.deadline(rpc.enqueue_batch(request)).await }
            })
            .await
            .map_err(error::write_error)?;
        Ok(response.into_inner().results)
    }
}
