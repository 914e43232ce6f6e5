//! The refunds arriving: spread evenly over a while, as a payment system
//! sends them, so the coordinators' failures happen while work flows. The
//! producer calls the same address as the workers (HAProxy, when several
//! coordinators run), and retries an Enqueue that found no coordinator
//! able to take it: Enqueue is idempotent on (queue, operation_key), so a
//! repeat of an applied one returns the job it made. Halfway through, one
//! merchant sends a bulk refund: thousands of refunds at once, in
//! EnqueueBatch calls back to back (see `fairness.rs`).
//!
//! Between batches it also sends again the refunds whose jobs the
//! coordinators already pruned (read from `operation_keys`), as a producer
//! that retries long after would: each must answer the pruned job,
//! `created=false` (docs/design.md rule 14); one that creates a job is a
//! violation of the invariant.

use anyhow::{bail, Result};
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{enqueue_batch_result, EnqueueBatchRequest, EnqueueRequest};
use sqlx::mysql::MySqlPool;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tonic::Code;

/// The producer's channel, with its bearer token on every call.
type Authed = tonic::service::interceptor::InterceptedService<
    tonic::transport::Channel,
    jobfence_worker::Authorization,
>;

/// How often the producer sends what is due.
const TICK: Duration = Duration::from_millis(100);
/// At most this many refunds in one EnqueueBatch.
const BATCH: u32 = 500;
/// Give up on one batch after this long of retrying.
const PATIENCE: Duration = Duration::from_secs(60);

/// The producer's Enqueues of keys whose jobs were already pruned.
#[derive(Debug, Default)]
pub struct PrunedRetries {
    /// Refunds sent again after their job was pruned.
    pub sent: AtomicU32,
    /// Of them, answered with the pruned job (same id), created=false.
    pub answered: AtomicU32,
    /// Of them, answered otherwise (a new job, another id, an error): each
    /// a violation.
    pub wrong: Mutex<Vec<String>>,
}

/// One merchant's bulk refund (docs/design.md rule 18): `count` refunds
/// of [`BULK_MERCHANT`] enqueued at once, in EnqueueBatch calls back to
/// back, `at` after the refunds began to arrive.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bulk {
    /// Refunds of the bulk merchant (0: none).
    pub count: u32,
    /// When they go in, from the first refund's arrival.
    pub at: Duration,
}

/// The bulk refund, once it is in: when its first call went (since the
/// refunds began to arrive) and how many calls it took.
#[derive(Debug, Clone, Copy)]
pub(super) struct BulkSent {
    /// When its first call went, from the first refund's arrival.
    pub at: Duration,
    /// Its EnqueueBatch calls.
    pub calls: u32,
}

/// The fairness key of the bulk refund's jobs.
pub(super) const BULK_MERCHANT: &str = "bulk-merchant";

/// The producer, running in the background.
pub(super) struct Arrivals {
    /// Refunds to send, the bulk refund's included.
    pub total: u32,
    arrived: Arc<AtomicU32>,
    retried: Arc<AtomicU32>,
    bulk: Arc<Mutex<Option<BulkSent>>>,
    bulk_count: u32,
    /// Its retries of pruned keys.
    pub pruned: Arc<PrunedRetries>,
    task: Option<JoinHandle<Result<Duration>>>,
    /// How long sending every refund took, once it is done.
    pub took: Option<Duration>,
}

impl Arrivals {
    /// Starts sending `total` refunds to `addr`, evenly over `over` (all
    /// at once when zero), and `bulk` on top of them.
    /// Refund `i` goes to `queues[i % queues.len()]`, as does bulk refund `i`.
    pub fn start(
        addr: &str,
        credentials: &jobfence_worker::Credentials,
        (total, over): (u32, Duration),
        bulk: Bulk,
        queues: Vec<String>,
        pools: Vec<MySqlPool>,
    ) -> Result<Arrivals> {
        let channel = credentials
            .endpoint(format!("http://{addr}"))?
            .connect_lazy();
        let producer = Producer {
            client: JobCoordinatorClient::with_interceptor(channel, credentials.authorization()),
            arrived: Arc::default(),
            retried: Arc::default(),
            bulk: Arc::default(),
            pruned: Pruned {
                pools,
                counts: Arc::default(),
                done: HashSet::new(),
            },
            queues,
        };
        Ok(Arrivals {
            total: total + bulk.count,
            arrived: producer.arrived.clone(),
            retried: producer.retried.clone(),
            bulk: producer.bulk.clone(),
            bulk_count: bulk.count,
            pruned: producer.pruned.counts.clone(),
            task: Some(tokio::spawn(producer.run(total, over, bulk))),
            took: None,
        })
    }

    /// Refunds enqueued so far.
    pub fn arrived(&self) -> u32 {
        self.arrived.load(Ordering::Relaxed)
    }

    /// EnqueueBatch calls sent again after finding no coordinator able to
    /// take them.
    pub fn retried(&self) -> u32 {
        self.retried.load(Ordering::Relaxed)
    }

    /// Refunds of the bulk refund.
    pub fn bulk_count(&self) -> u32 {
        self.bulk_count
    }

    /// The bulk refund, once it is in.
    pub fn bulk_sent(&self) -> Option<BulkSent> {
        *self.bulk.lock().expect("bulk refund")
    }

    /// True once every refund is enqueued; an error if the producer gave up.
    pub async fn done(&mut self) -> Result<bool> {
        match &self.task {
            Some(t) if t.is_finished() => {
                let took = self.task.take().expect("checked above").await??;
                self.took = Some(took);
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Ok(true),
        }
    }
}

impl Drop for Arrivals {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// The refund number `i`: one in a hundred goes to a payment the provider
/// refuses (so some end failed or in manual review).
pub(super) fn refund(i: u32, queue: &str) -> EnqueueRequest {
    let payment = if i % 100 == 99 {
        format!("{}{i:06}", jobfence_fake_provider::FAILING_PAYMENT_PREFIX)
    } else {
        format!("pay_{i:06}")
    };
    // Ten merchants share the queue; claims go round-robin across them
    // (docs/design.md rule 18).
    refund_of(i, queue, payment, format!("merchant-{:02}", i % 10))
}

/// The bulk refund's refund number `i`, of [`BULK_MERCHANT`], on payments
/// the provider refunds.
pub(super) fn bulk_refund(i: u32, queue: &str) -> EnqueueRequest {
    refund_of(i, queue, format!("pay_bulk_{i:06}"), BULK_MERCHANT.into())
}

fn refund_of(i: u32, queue: &str, payment: String, merchant: String) -> EnqueueRequest {
    let amount = 100 + (i as i64 * 37) % 9_900;
    EnqueueRequest {
        queue: queue.into(),
        operation_key: format!("refund-{payment}-{amount}-TWD"),
        payload: format!(r#"{{"payment_id":"{payment}","amount":{amount},"currency":"TWD"}}"#),
        delay: None,
        fairness_key: merchant,
        priority: 0,
    }
}

/// Failures after which nothing, or an Enqueue that a repeat recognises,
/// was applied: no coordinator serving, the database unreachable, a
/// coordinator stopping or killed mid-call, an overloaded one.
fn worth_retrying(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::ResourceExhausted
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::Cancelled
    )
}

/// The producer's task and what it shares with [`Arrivals`].
struct Producer {
    client: JobCoordinatorClient<Authed>,
    queues: Vec<String>,
    arrived: Arc<AtomicU32>,
    retried: Arc<AtomicU32>,
    bulk: Arc<Mutex<Option<BulkSent>>>,
    pruned: Pruned,
}

impl Producer {
    /// Sends the `total` refunds evenly over `over`, and `bulk` when it
    /// is due; returns how long it took.
    async fn run(mut self, total: u32, over: Duration, bulk: Bulk) -> Result<Duration> {
        let start = Instant::now();
        let queues = self.queues.clone();
        let queue = |i: u32| queues[i as usize % queues.len()].clone();
        // Every refund by its operation key, for the retries of pruned ones.
        let by_key: HashMap<String, EnqueueRequest> = (0..total)
            .map(|i| refund(i, &queue(i)))
            .chain((0..bulk.count).map(|i| bulk_refund(i, &queue(i))))
            .map(|r| (r.operation_key.clone(), r))
            .collect();
        let (mut sent, mut bulk_due) = (0u32, bulk.count > 0);
        while sent < total || bulk_due {
            let due = if over.is_zero() {
                total
            } else {
                let share = start.elapsed().as_secs_f64() / over.as_secs_f64();
                ((total as f64 * share).ceil() as u32).clamp(sent, total)
            };
            while sent < due {
                let upto = due.min(sent + BATCH);
                let items = (sent..upto).map(|i| refund(i, &queue(i))).collect();
                self.send(items, &format!("refunds {sent}..{upto}")).await?;
                sent = upto;
            }
            if bulk_due && start.elapsed() >= bulk.at {
                self.send_bulk(bulk.count, start.elapsed()).await?;
                bulk_due = false;
            }
            self.pruned.retry(&mut self.client, &by_key).await;
            if sent < total || bulk_due {
                tokio::time::sleep(TICK).await;
            }
        }
        Ok(start.elapsed())
    }

    /// The bulk refund's `count` refunds, [`BATCH`] to a call, back to back.
    async fn send_bulk(&mut self, count: u32, at: Duration) -> Result<()> {
        let mut calls = 0;
        for first in (0..count).step_by(BATCH as usize) {
            let upto = count.min(first + BATCH);
            let items = (first..upto)
                .map(|i| bulk_refund(i, &self.queues[i as usize % self.queues.len()]))
                .collect();
            self.send(items, &format!("bulk refunds {first}..{upto}"))
                .await?;
            calls += 1;
        }
        *self.bulk.lock().expect("bulk refund") = Some(BulkSent { at, calls });
        Ok(())
    }

    /// One EnqueueBatch of `items` (`what`, for its error), sent again
    /// with a backoff while no coordinator can take it, for up to
    /// [`PATIENCE`]; counted as arrived once in.
    async fn send(&mut self, items: Vec<EnqueueRequest>, what: &str) -> Result<()> {
        let n = items.len() as u32;
        let request = EnqueueBatchRequest { items };
        let since = Instant::now();
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.client.enqueue_batch(request.clone()).await {
                Ok(_) => break,
                Err(s) if worth_retrying(&s) && since.elapsed() < PATIENCE => {
                    self.retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(s) => bail!("enqueueing {what} failed: {s:?}"),
            }
        }
        self.arrived.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

/// The producer's side of pruning: which pruned keys it sent again.
struct Pruned {
    pools: Vec<MySqlPool>,
    counts: Arc<PrunedRetries>,
    done: HashSet<String>,
}

impl Pruned {
    /// Sends again (one EnqueueBatch) up to 100 refunds whose jobs were
    /// pruned and that were not sent again yet, and checks each answer.
    /// A failed read or call is left for the next tick.
    async fn retry(
        &mut self,
        client: &mut JobCoordinatorClient<Authed>,
        by_key: &HashMap<String, EnqueueRequest>,
    ) {
        let mut records = Vec::new();
        for pool in &self.pools {
            let Ok(rows) = sqlx::query_as::<_, (String, u64)>(
                "SELECT CAST(operation_key AS CHAR), job_id FROM operation_keys",
            )
            .fetch_all(pool)
            .await
            else {
                return;
            };
            records.extend(rows);
        }
        let picked: Vec<(String, u64, &EnqueueRequest)> = records
            .into_iter()
            .filter(|(k, _)| !self.done.contains(k))
            .filter_map(|(k, id)| by_key.get(&k).map(|r| (k, id, r)))
            .take(100)
            .collect();
        if picked.is_empty() {
            return;
        }
        let request = EnqueueBatchRequest {
            items: picked.iter().map(|&(_, _, r)| r.clone()).collect(),
        };
        let Ok(answer) = client.enqueue_batch(request).await else {
            return;
        };
        let c = &self.counts;
        for ((key, id, _), result) in picked.iter().zip(answer.into_inner().results) {
            self.done.insert(key.clone());
            c.sent.fetch_add(1, Ordering::Relaxed);
            match result.result {
                Some(enqueue_batch_result::Result::Enqueued(e))
                    if !e.created && e.job.as_ref().is_some_and(|j| j.job_id == *id) =>
                {
                    c.answered.fetch_add(1, Ordering::Relaxed);
                }
                other => c
                    .wrong
                    .lock()
                    .expect("pruned retries")
                    .push(format!("re-enqueue of pruned {key} (job {id}): {other:?}")),
            }
        }
    }
}
