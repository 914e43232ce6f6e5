//! The settlement import paces itself by what it costs the workers
//! (`jobfence_domain::pacing`), against a real MariaDB. Made deterministic
//! with the pause point in the import's rest: the test makes the workers'
//! jobs move only while the import rests (on another coordinator of the
//! database), so a batch stops them outright and the import must yield;
//! and says so while it runs (ListSettlementImports), in its metrics and in
//! its answer. With nothing moving, the same import runs flat out.

use jobfence_testkit as kit;

use crate::settlement::{line, provider, P};
use jobfence_api::v1 as proto;
use jobfence_api::v1::import_settlement_request::Part;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_store::PausePoint;
use kit::Harness;
use tokio::sync::mpsc;

/// The import's stream, driven by the test, and its running call; its
/// refunds' references and keys start with `prefix` (two imports at once
/// write apart).
pub(crate) struct Streamed {
    tx: mpsc::Sender<proto::ImportSettlementRequest>,
    call: tokio::task::JoinHandle<Result<proto::ImportSettlementResponse, tonic::Status>>,
    prefix: &'static str,
    next_line: u64,
}

impl Streamed {
    pub(crate) async fn start(h: &Harness, import_id: &str, prefix: &'static str) -> Streamed {
        let (tx, rx) = mpsc::channel(1);
        let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
            .await
            .unwrap();
        let call = tokio::spawn(async move {
            admin
                .import_settlement(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map(|r| r.into_inner())
        });
        let now = chrono::Utc::now();
        tx.send(proto::ImportSettlementRequest {
            part: Some(Part::Header(proto::ImportSettlementHeader {
                provider: P.into(),
                period_start: Some(prost_types::Timestamp {
                    seconds: 946_684_800,
                    nanos: 0,
                }),
                period_end: Some(prost_types::Timestamp {
                    seconds: now.timestamp(),
                    nanos: 0,
                }),
                operator: "alice".into(),
                check_only: false,
                allow_empty: false,
                import_id: import_id.into(),
            })),
        })
        .await
        .unwrap();
        Streamed {
            tx,
            call,
            prefix,
            next_line: 2,
        }
    }

    /// Sends a batch of five refunds nobody enqueued.
    pub(crate) async fn batch(&mut self) {
        let lines = (0..5)
            .map(|_| {
                let n = self.next_line;
                self.next_line += 1;
                let l = line(
                    n,
                    &format!("re_{}_{n}", self.prefix),
                    &format!("{}-{n}", self.prefix),
                    500,
                    "succeeded",
                );
                proto::SettlementReportLine {
                    line: l.line,
                    fields: l.fields.into_iter().collect(),
                    unreadable: Default::default(),
                }
            })
            .collect();
        self.tx
            .send(proto::ImportSettlementRequest {
                part: Some(Part::Lines(proto::SettlementLineBatch { lines })),
            })
            .await
            .unwrap();
    }

    pub(crate) async fn finish(self) -> proto::ImportSettlementResponse {
        drop(self.tx);
        self.call.await.unwrap().unwrap()
    }
}

/// What ListSettlementImports says of the import named `id`.
async fn listed(h: &Harness, id: &str) -> proto::SettlementImportProgress {
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let all = admin
        .list_settlement_imports(proto::ListSettlementImportsRequest {
            provider: P.into(),
            import_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .imports;
    assert_eq!(all.len(), 1, "{all:?}");
    all.into_iter().next().unwrap()
}

fn seconds(d: Option<prost_types::Duration>) -> f64 {
    let d = d.expect("a duration");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// One series of the coordinator's metrics, by its whole name and labels.
pub(crate) fn metric(h: &Harness, series: &str) -> f64 {
    let text = h.coordinator.metrics().render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// 1,000 jobs enqueued through another coordinator of the database: 1,000
/// job events, as many as a busy fleet makes in a moment.
pub(crate) async fn workers_move(replica: &kit::Replica, round: u32) {
    let items = (0..1000)
        .map(|i| proto::EnqueueRequest {
            queue: "busy".into(),
            operation_key: format!("busy-{round}-{i}"),
            payload: "{}".into(),
            ..Default::default()
        })
        .collect();
    let done = replica
        .client
        .clone()
        .enqueue_batch(proto::EnqueueBatchRequest { items })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.results.len(), 1000);
}

/// The first batch ran with nothing else moving; while the import rests
/// after it, the workers (on another coordinator) make 1,000 events; the
/// second batch again sees nothing move. So a batch stopped the workers
/// outright, and the import yields: it rests after the second batch, its
/// listing says "yielding" and why, the yielding gauge is 1, and its
/// answer counts the time it yielded.
#[tokio::test]
async fn an_import_that_stops_the_workers_yields_to_them_and_says_so() {
    let h = Harness::start().await;
    provider(&h).await;
    let replica = h.replica(kit::test_config()).await;
    let mut first_rest = h.pauses.arm(PausePoint::PacedRest);
    let mut import = Streamed::start(&h, "paced-1", "nobody").await;
    import.batch().await;
    first_rest.reached().await;
    let before = listed(&h, "paced-1").await;
    assert_eq!(before.lines_read, 5);
    assert_eq!(
        before.pace.as_ref().unwrap().state(),
        proto::PaceState::Alone,
        "nothing measured yet: {before:?}"
    );
    workers_move(&replica, 1).await;
    let mut second_rest = h.pauses.arm(PausePoint::PacedRest);
    first_rest.release();
    import.batch().await;
    second_rest.reached().await;
    let during = listed(&h, "paced-1").await;
    let pace = during.pace.unwrap();
    assert_eq!(pace.state(), proto::PaceState::Yielding, "{pace:?}");
    assert_eq!(pace.slower, 1.0);
    assert!((pace.busy - 0.08).abs() < 1e-9, "{pace:?}");
    assert_eq!(
        pace.summary,
        "yielding: the workers' jobs 100 % slower than alone, working 8 % of the time"
    );
    assert!(seconds(pace.yielded) > 0.0, "{pace:?}");
    assert_eq!(
        metric(
            &h,
            "jobfence_background_yielding{work=\"settlement_import\"}"
        ),
        1.0
    );
    assert!(
        metric(
            &h,
            "jobfence_background_rest_seconds_total{why=\"yield\",work=\"settlement_import\"}"
        ) > 0.0
    );
    second_rest.release();
    let answer = import.finish().await;
    assert_eq!(answer.lines_new, 10);
    let pace = answer.pace.unwrap();
    assert_eq!(pace.state(), proto::PaceState::Yielding, "{pace:?}");
    assert!(seconds(pace.yielded) > 0.0, "{pace:?}");
    // Ended: no longer listed, and the gauge is back to 0.
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let after = admin
        .list_settlement_imports(proto::ListSettlementImportsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(after.imports.is_empty(), "{after:?}");
    assert_eq!(
        metric(
            &h,
            "jobfence_background_yielding{work=\"settlement_import\"}"
        ),
        0.0
    );
}

/// The same import with nothing else moving: after the first batch it
/// rests once to look (a probe), finds nothing, and runs the other
/// batches flat out: it never yields, and says so.
#[tokio::test]
async fn an_import_with_nothing_else_running_goes_flat_out() {
    let h = Harness::start().await;
    provider(&h).await;
    let mut probe = h.pauses.arm(PausePoint::PacedRest);
    let mut import = Streamed::start(&h, "alone-1", "nobody").await;
    import.batch().await;
    probe.reached().await;
    probe.release();
    for _ in 0..5 {
        import.batch().await;
    }
    let during = listed(&h, "alone-1").await;
    assert_eq!(
        during.pace.unwrap().summary,
        "flat out: nothing else is running"
    );
    let answer = import.finish().await;
    assert_eq!(answer.lines_new, 30);
    let pace = answer.pace.unwrap();
    assert_eq!(pace.state(), proto::PaceState::Alone, "{pace:?}");
    assert_eq!(seconds(pace.yielded), 0.0, "{pace:?}");
    assert_eq!(
        metric(
            &h,
            "jobfence_background_rest_seconds_total{why=\"yield\",work=\"settlement_import\"}"
        ),
        0.0
    );
}
