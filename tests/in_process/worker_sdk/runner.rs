//! The Rust SDK's runner against the real coordinator and MariaDB: it never
//! runs a handler for a claim it did not hear back from, keeps at most
//! max_in_flight jobs at once, lets the handler in flight finish on
//! shutdown (and abandons one still running after the grace, its job left
//! leased), and releases a job its handler left unsettled to reconcile.

use super::*;

/// Counts calls and completes.
struct Counting(Arc<AtomicU32>);

impl Handler for Counting {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        job.complete("re_counted", "ok").await?;
        Ok(())
    }
}

#[tokio::test]
async fn the_runner_never_runs_a_handler_for_a_claim_it_did_not_hear_back_from() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-runner-unclear", "{}").await;
    let proxy = Proxy::start(h.addr).await;
    let client = WorkerClient::connect(format!("http://{}", proxy.addr), config("worker-a", Q))
        .await
        .unwrap();
    proxy.swallow_responses(true);
    let ran = Arc::new(AtomicU32::new(0));
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = tokio::spawn({
        let ran = ran.clone();
        async move {
            Worker::new(client)
                .run(Counting(ran), async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    // Its claim commits, the answer is lost; it is stopped meanwhile.
    kit::sdk::wait_for_row(&h, enqueued.job_id, "claimed", |j| {
        j.state == JobState::Running
    })
    .await;
    let _ = stop.send(());
    proxy.cut();
    let report = runner.await.unwrap();
    // Its claim is either reported unclear (the transport failed first) or
    // cut short by the stop signal while waiting for its answer.
    assert_eq!(
        report.unclear_claims + report.interrupted_claims,
        1,
        "{report:?}"
    );
    assert_eq!((report.claimed, report.handled), (0, 0), "{report:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");
    let row = h.row(enqueued.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 1));
    h.finish().await;
}

/// Records how many handlers run at once and how many jobs are held, then
/// waits at a barrier of `max_in_flight` before completing.
struct Gauge {
    pool: sqlx::MySqlPool,
    limit: i64,
    now: AtomicU32,
    max: AtomicU32,
    over_held: AtomicBool,
    barrier: Barrier,
    done: AtomicU32,
    total: u32,
    all_done: Arc<Notify>,
}

impl Handler for Gauge {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        // Never hoard: jobs held (running rows) never exceed the slots.
        if kit::sdk::running_rows(&self.pool).await > self.limit {
            self.over_held.store(true, Ordering::SeqCst);
        }
        // Only passes once `max_in_flight` handlers are in flight together.
        self.barrier.wait().await;
        let reference = format!("re_{}", job.job_id());
        job.complete(&reference, "ok").await?;
        self.now.fetch_sub(1, Ordering::SeqCst);
        if self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.total {
            self.all_done.notify_one();
        }
        Ok(())
    }
}

#[tokio::test]
async fn the_runner_handles_every_job_with_at_most_max_in_flight_at_once() {
    const SLOTS: u32 = 3;
    const JOBS: u32 = 9; // a multiple of SLOTS: every barrier generation fills
    let h = Harness::start().await;
    for i in 0..JOBS {
        h.enqueue(Q, &format!("refund-many-{i}"), "{}").await;
    }
    let mut cfg = config("worker-a", Q);
    cfg.max_in_flight = SLOTS;
    let client = sdk(&h, cfg).await;
    let all_done = Arc::new(Notify::new());
    let gauge = Gauge {
        pool: h.pool.clone(),
        limit: i64::from(SLOTS),
        now: AtomicU32::new(0),
        max: AtomicU32::new(0),
        over_held: AtomicBool::new(false),
        barrier: Barrier::new(SLOTS as usize),
        done: AtomicU32::new(0),
        total: JOBS,
        all_done: all_done.clone(),
    };
    let gauge = Arc::new(gauge);
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        Worker::new(client).run(
            Shared(gauge.clone()),
            async move { all_done.notified().await },
        ),
    )
    .await
    .expect("the runner handles every job (a stuck barrier means fewer slots were used)");
    assert_eq!(gauge.max.load(Ordering::SeqCst), SLOTS);
    assert!(
        !gauge.over_held.load(Ordering::SeqCst),
        "held more jobs than slots"
    );
    assert_eq!(report.claimed, u64::from(JOBS));
    // The first Claim fills the slots; every later job came with the
    // Complete that freed its slot (docs/design.md rule 16).
    assert_eq!(report.on_write_back, u64::from(JOBS - SLOTS));
    assert_eq!(report.handled, u64::from(JOBS));
    assert_eq!((report.released, report.abandoned), (0, 0));
    let done: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'succeeded'")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(done, i64::from(JOBS));
    h.finish().await;
}

/// A handler shared with the test.
struct Shared<H>(Arc<H>);

impl<H: Handler> Handler for Shared<H> {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        self.0.handle(job).await
    }
}

/// Tells the test it started, then waits for its go before completing.
struct Gated {
    started: std::sync::Mutex<Option<oneshot::Sender<u64>>>,
    go: tokio::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Handler for Gated {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        if let Some(tx) = self.started.lock().unwrap().take() {
            let _ = tx.send(job.job_id());
        }
        let go = self.go.lock().await.take();
        match go {
            Some(go) => go.await?,
            None => std::future::pending::<()>().await,
        }
        job.complete("re_gated", "ok").await?;
        Ok(())
    }
}

fn gated() -> (Gated, oneshot::Receiver<u64>, oneshot::Sender<()>) {
    let (started_tx, started) = oneshot::channel();
    let (go, go_rx) = oneshot::channel();
    let handler = Gated {
        started: std::sync::Mutex::new(Some(started_tx)),
        go: tokio::sync::Mutex::new(Some(go_rx)),
    };
    (handler, started, go)
}

#[tokio::test]
async fn shutdown_lets_the_handler_in_flight_finish_and_claims_nothing_more() {
    let h = Harness::start().await;
    let first = h.enqueue(Q, "refund-in-flight", "{}").await;
    // One slot: while the handler runs the runner only waits for the slot,
    // with no Claim in flight that could still pick up later work.
    let client = sdk(&h, config("worker-a", Q)).await;
    let (handler, started, go) = gated();
    let (stop, stopped) = oneshot::channel::<()>();
    // The run loop by its name on the client (the same loop as Worker::run).
    let runner = tokio::spawn(async move {
        client
            .run(handler, async {
                let _ = stopped.await;
            })
            .await
    });
    assert_eq!(started.await.unwrap(), first.job_id);
    stop.send(()).unwrap();
    // Work that arrives after the signal is not taken, though the slot frees.
    let later = h.enqueue(Q, "refund-after-shutdown", "{}").await;
    go.send(()).unwrap();
    let report = runner.await.unwrap();
    assert_eq!(report.claimed, 1, "{report:?}");
    assert_eq!(report.handled, 1);
    assert_eq!(report.abandoned, 0);
    assert_eq!(h.row(first.job_id).await.state, JobState::Succeeded);
    let row = h.row(later.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Ready, 0));
    h.finish().await;
}

#[tokio::test]
async fn a_handler_still_running_after_the_grace_is_abandoned_and_its_job_stays_leased() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-stuck", "{}").await;
    let mut cfg = config("worker-a", Q);
    cfg.shutdown_grace = Duration::from_millis(100);
    let client = sdk(&h, cfg).await;
    let (handler, started, _never) = gated(); // the handler waits forever
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = tokio::spawn(async move {
        Worker::new(client)
            .run(handler, async {
                let _ = stopped.await;
            })
            .await
    });
    started.await.unwrap();
    stop.send(()).unwrap();
    let report = runner.await.unwrap();
    assert_eq!(report.abandoned, 1, "{report:?}");
    assert_eq!(report.handled, 0);
    // Fenced, not lost: held by attempt 1 until a takeover reconciles it.
    let row = h.row(job.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 1));
    h.finish().await;
}

/// Fails without writing back.
struct GivesUp(Arc<Notify>);

impl Handler for GivesUp {
    async fn handle(&self, _job: &mut ClaimedJob) -> Result<(), HandlerError> {
        self.0.notify_one();
        Err("provider timed out".into())
    }
}

#[tokio::test]
async fn a_job_left_unsettled_by_its_handler_is_released_to_reconcile() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-gives-up", "{}").await;
    let client = sdk(&h, config("worker-a", Q)).await;
    let returned = Arc::new(Notify::new());
    let stop = returned.clone();
    let report = Worker::new(client)
        .run(GivesUp(returned), async move { stop.notified().await })
        .await;
    assert_eq!(report.handled, 1, "{report:?}");
    assert_eq!((report.handler_errors, report.released), (1, 1));
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Ready);
    assert_eq!(
        row.next_action,
        DomainAction::Reconcile,
        "never a blind resend"
    );
    assert!(row.last_error.unwrap().contains("provider timed out"));
    h.finish().await;
}
