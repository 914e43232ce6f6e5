//! Natural batching: calls queue up while the database is busy with the
//! previous batches, and the next free slot takes everything waiting (up to
//! a maximum) as one batch. Under light load a batch is one call and adds
//! only a channel hop; under heavy load batches grow by themselves, and
//! every call of a batch shares one transaction, one fsync and a handful of
//! round trips.
//!
//! Back-pressure: at most `queue_capacity` calls wait; the next one is
//! refused at once with `Overloaded`, before anything is written. A call
//! whose caller went away (its gRPC call was cancelled) before its batch
//! started is left out of the batch: it was never answered, so it may as
//! well not have run.

use jobfence_domain::CoordinatorError;
use prometheus::Histogram;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// How a [`Batcher`] groups calls.
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    /// Most calls in one batch.
    pub max_batch: usize,
    /// Most batches running at once (each holds one database connection).
    pub concurrency: usize,
    /// Most calls waiting for a batch; past it calls are refused
    /// `Overloaded`.
    pub queue_capacity: usize,
}

struct Queued<T, R> {
    item: T,
    reply: oneshot::Sender<Result<R, CoordinatorError>>,
}

/// Runs calls of one kind in batches (see the module docs). Cheap to
/// clone; the batches stop once every clone is dropped and the queue is
/// empty.
pub struct Batcher<T, R> {
    what: &'static str,
    capacity: usize,
    tx: mpsc::Sender<Queued<T, R>>,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Batcher {
            what: self.what,
            capacity: self.capacity,
            tx: self.tx.clone(),
        }
    }
}

impl<T, R> std::fmt::Debug for Batcher<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("what", &self.what)
            .field("waiting", &(self.capacity - self.tx.capacity()))
            .finish()
    }
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Starts the dispatcher. `run` executes one batch and answers every
    /// item, in order; `sizes` observes each batch's size. `what` names the
    /// calls in errors and logs.
    pub fn spawn<F, Fut>(
        what: &'static str,
        settings: BatchSettings,
        sizes: Histogram,
        run: F,
    ) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<Queued<T, R>>(settings.queue_capacity.max(1));
        let slots = Arc::new(Semaphore::new(settings.concurrency.max(1)));
        let run = Arc::new(run);
        let max = settings.max_batch.max(1);
        tokio::spawn(async move {
            loop {
                // Take a slot first: while every slot is busy, calls pile
                // up in the channel and the next batch takes them all.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else { return };
                let mut batch = Vec::with_capacity(max.min(64));
                batch.push(first);
                while batch.len() < max {
                    match rx.try_recv() {
                        Ok(q) => batch.push(q),
                        Err(_) => break,
                    }
                }
                batch.retain(|q| !q.reply.is_closed());
                if batch.is_empty() {
                    continue;
                }
                sizes.observe(batch.len() as f64);
                let run = run.clone();
                tokio::spawn(async move {
                    let (items, replies): (Vec<T>, Vec<_>) =
                        batch.into_iter().map(|q| (q.item, q.reply)).unzip();
                    let answers = run(items).await;
                    answer_all(what, replies, answers);
                    drop(slot);
                });
            }
        });
        Batcher {
            what,
            capacity: settings.queue_capacity.max(1),
            tx,
        }
    }

    /// Queues `item` and waits for its answer. `Overloaded` at once when
    /// the queue is full.
    pub async fn submit(&self, item: T) -> Result<R, CoordinatorError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .try_send(Queued { item, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => CoordinatorError::Overloaded {
                    what: self.what,
                    pending: self.capacity,
                },
                mpsc::error::TrySendError::Closed(_) => {
                    CoordinatorError::Internal(format!("the {} batcher stopped", self.what))
                }
            })?;
        answer.await.map_err(|_| {
            // The batch task panicked: a bug, and nothing says whether the
            // batch committed.
            CoordinatorError::CommitOutcomeUnknown(format!("the {} batch was lost", self.what))
        })?
    }

    /// Calls waiting for a batch now.
    pub fn waiting(&self) -> usize {
        self.capacity - self.tx.capacity()
    }
}

/// Sends each caller its answer, in order. A batch that answered fewer
/// calls than it was given is a bug (`run` must answer every item); the
/// callers left over are told so, `Internal`, rather than left to find
/// their reply dropped.
fn answer_all<R>(
    what: &'static str,
    replies: Vec<oneshot::Sender<Result<R, CoordinatorError>>>,
    answers: Vec<R>,
) {
    let (given, answered) = (replies.len(), answers.len());
    if answered != given {
        tracing::error!(
            what,
            given,
            answered,
            "a batch answered a different number of calls"
        );
    }
    let mut answers = answers.into_iter();
    for reply in replies {
        let answer = answers.next().ok_or_else(|| {
            CoordinatorError::Internal(format!(
                "the {what} batch answered {answered} of its {given} calls"
            ))
        });
        let _ = reply.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn sizes() -> Histogram {
        Histogram::with_opts(prometheus::HistogramOpts::new("t", "t")).unwrap()
    }

    #[tokio::test]
    async fn calls_that_wait_together_run_as_one_batch_and_each_gets_its_answer() {
        let (gate_tx, gate_rx) = tokio::sync::watch::channel(false);
        let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = batches.clone();
        let b: Batcher<u32, u32> = Batcher::spawn(
            "test",
            BatchSettings {
                max_batch: 10,
                concurrency: 1,
                queue_capacity: 100,
            },
            sizes(),
            move |items: Vec<u32>| {
                let mut gate = gate_rx.clone();
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(items.clone());
                    // The first batch holds the only slot until released.
                    let _ = gate.wait_for(|open| *open).await;
                    items.iter().map(|i| i * 10).collect()
                }
            },
        );
        let first = tokio::spawn({
            let b = b.clone();
            async move { b.submit(1).await }
        });
        // Wait until the first call runs alone, then queue three more
        // behind it.
        while batches.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (2..=4)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.submit(i).await })
            })
            .collect();
        while b.waiting() < 3 {
            tokio::task::yield_now().await;
        }
        gate_tx.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 10);
        for (i, r) in rest.into_iter().enumerate() {
            assert_eq!(r.await.unwrap().unwrap(), (i as u32 + 2) * 10);
        }
        assert_eq!(*batches.lock().unwrap(), vec![vec![1], vec![2, 3, 4]]);
    }

    #[tokio::test]
    async fn a_batch_that_answers_too_few_calls_answers_the_rest_internal() {
        let (gate_tx, gate_rx) = tokio::sync::watch::channel(false);
        let started = Arc::new(AtomicUsize::new(0));
        let counted = started.clone();
        // A broken `run`: it answers only the first call of each batch.
        let b: Batcher<u32, u32> = Batcher::spawn(
            "test",
            BatchSettings {
                max_batch: 10,
                concurrency: 1,
                queue_capacity: 100,
            },
            sizes(),
            move |items: Vec<u32>| {
                let mut gate = gate_rx.clone();
                counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    let _ = gate.wait_for(|open| *open).await;
                    items.into_iter().take(1).collect()
                }
            },
        );
        let first = tokio::spawn({
            let b = b.clone();
            async move { b.submit(1).await }
        });
        while started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (2..=3)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.submit(i).await })
            })
            .collect();
        while b.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        gate_tx.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        let mut answers = Vec::new();
        for r in rest {
            answers.push(r.await.unwrap());
        }
        assert_eq!(answers[0].as_ref().unwrap(), &2, "the batch's first call");
        match &answers[1] {
            Err(CoordinatorError::Internal(why)) => {
                assert!(why.contains("answered 1 of its 2 calls"), "{why}")
            }
            other => panic!("the unanswered call got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let b: Batcher<u32, u32> = Batcher::spawn(
            "test",
            BatchSettings {
                max_batch: 1,
                concurrency: 1,
                queue_capacity: 1,
            },
            sizes(),
            move |items: Vec<u32>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    std::future::pending::<()>().await;
                    items
                }
            },
        );
        let _held = tokio::spawn({
            let b = b.clone();
            async move { b.submit(1).await }
        });
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let _queued = tokio::spawn({
            let b = b.clone();
            async move { b.submit(2).await }
        });
        while b.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let refused = b.submit(3).await.unwrap_err();
        assert!(
            matches!(refused, CoordinatorError::Overloaded { .. }),
            "{refused}"
        );
    }
}
