//! Traces across the wire (docs/operating.md "Tracing"), on the real
//! binary: `jobfence serve --otlp-endpoint` exports its RPC spans to a
//! collector (the test kit's stand-in), and a worker's span reaches it as
//! the parent of the coordinator's span of each call the worker made in
//! it, through the `traceparent` the Rust SDK sends (feature `otel`).

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::EnqueueRequest;
use jobfence_testkit::otlp::{OtlpReceiver, ReceivedSpan};
use jobfence_testkit::process::ServeLog;
use jobfence_testkit::TestDb;
use jobfence_worker::{WorkerClient, WorkerConfig};
use opentelemetry::trace::{FutureExt, Span, TraceContextExt, Tracer, TracerProvider};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::process::Stdio;
use std::time::Duration;

const QUEUE: &str = "traced-refunds";
/// The worker's own `service.name`, as the test's tracer exports it.
const WORKER_SERVICE: &str = "traced-refund-worker";

/// A `jobfence serve` child exporting to `endpoint`.
fn serve(db: &TestDb, endpoint: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_jobfence"))
        .args(["serve", "--database-url", &db.url, "--insecure"])
        .args(["--listen", "127.0.0.1:0", "--drain-delay", "0s"])
        .args(["--otlp-endpoint", endpoint])
        .env("JOBFENCE_LOG", "info")
        .env_remove("JOBFENCE_OTLP_ENDPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start jobfence serve")
}

/// The worker's tracer provider, exporting to the same collector.
fn worker_tracing(endpoint: &str) -> SdkTracerProvider {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .unwrap();
    SdkTracerProvider::builder()
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(WORKER_SERVICE)
                .build(),
        )
        .with_batch_exporter(exporter)
        .build()
}

/// Enqueued outside any trace: its coordinator span starts a trace of
/// its own.
async fn enqueue(addr: std::net::SocketAddr) -> u64 {
    let mut client = JobCoordinatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let job = client
        .enqueue(EnqueueRequest {
            queue: QUEUE.into(),
            operation_key: "refund-traced-1".into(),
            payload: "{}".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    job.job_id
}

/// The worker's part, in its span "handle refund": a Claim and a
/// Complete through the Rust SDK.
async fn claim_and_complete(addr: std::net::SocketAddr, job_id: u64) {
    let worker = WorkerClient::connect(
        format!("http://{addr}"),
        WorkerConfig::new("traced-worker-1", QUEUE),
    )
    .await
    .unwrap();
    let mut jobs = worker.claim(1).await.unwrap();
    assert_eq!(jobs.len(), 1, "the job enqueued is claimed");
    let job = &mut jobs[0];
    assert_eq!(job.job_id(), job_id);
    job.complete("re_traced_1", r#"{"status":"succeeded"}"#)
        .await
        .unwrap();
}

/// A span of the coordinator named `name` (every RPC span is named after
/// its RPC).
fn coordinator_span<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.service == "jobfence" && s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_span_is_the_parent_of_the_coordinators_spans_of_its_calls() {
    let receiver = OtlpReceiver::start().await;
    let db = TestDb::new().await;
    let mut child = serve(&db, &receiver.endpoint());
    let log = ServeLog::follow(&mut child);
    let addr = log.grpc().await;
    let job_id = enqueue(addr).await;

    let provider = worker_tracing(&receiver.endpoint());
    let tracer = provider.tracer("jobfence-system-test");
    let span = tracer.start("handle refund");
    let (trace_id, span_id) = {
        let sc = span.span_context();
        (sc.trace_id().to_string(), sc.span_id().to_string())
    };
    let cx = opentelemetry::Context::current_with_span(span);
    claim_and_complete(addr, job_id)
        .with_context(cx.clone())
        .await;
    cx.span().end();
    let flushed = tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap();
    flushed.expect("the worker's span is exported");

    // Stopped: the coordinator sends its last spans on the way out.
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the coordinator stops on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    receiver
        .until_span("Complete from jobfence", Duration::from_secs(10), |s| {
            s.service == "jobfence" && s.name == "Complete"
        })
        .await;

    let spans = receiver.spans();
    let worker = spans
        .iter()
        .find(|s| s.service == WORKER_SERVICE)
        .expect("the worker's span arrived");
    assert_eq!((&worker.trace_id, &worker.span_id), (&trace_id, &span_id));
    let job = job_id.to_string();
    for (rpc, job_fields) in [
        ("Claim", vec![("queue", QUEUE)]),
        (
            "Complete",
            vec![("job_id", job.as_str()), ("queue", QUEUE), ("attempt", "1")],
        ),
    ] {
        let s = coordinator_span(&spans, rpc);
        assert_eq!(
            s.trace_id, trace_id,
            "{rpc} is in the worker's trace: {s:#?}"
        );
        assert_eq!(
            s.parent_span_id, span_id,
            "{rpc}'s parent is the worker's span"
        );
        assert_eq!(s.service_version, env!("CARGO_PKG_VERSION"), "{s:#?}");
        for (field, value) in job_fields {
            assert_eq!(
                s.attributes.get(field).map(String::as_str),
                Some(value),
                "{rpc}.{field}: {s:#?}"
            );
        }
        assert_eq!(s.attributes.get("outcome").map(String::as_str), Some("ok"));
    }
    // A call made outside any trace starts one of its own.
    let enqueued = coordinator_span(&spans, "Enqueue");
    assert_ne!(enqueued.trace_id, trace_id);
    assert_eq!(enqueued.parent_span_id, "", "{enqueued:#?}");
    assert_eq!(enqueued.attributes.get("job_id"), Some(&job));
}
