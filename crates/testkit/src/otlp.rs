//! A stand-in OpenTelemetry collector: an OTLP/gRPC receiver
//! (`opentelemetry.proto.collector.trace.v1.TraceService/Export`) on a
//! loopback port of its own, keeping every span it is sent in memory, so
//! a test can point `jobfence serve --otlp-endpoint` (and its own tracer)
//! at it and read back what arrived, from which service.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

/// One span as the receiver got it, ids in lowercase hex (the
/// `traceparent` spelling), attribute values as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// The exporting process's `service.name`.
    pub service: String,
    /// The exporting process's `service.version` ("" when not sent).
    pub service_version: String,
    /// The span's name (an RPC's span is named after the RPC).
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, or "" for a root span.
    pub parent_span_id: String,
    /// The span's attributes (for a `tracing` span: its recorded fields).
    pub attributes: BTreeMap<String, String>,
}

/// The receiver, serving until dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    _stop: oneshot::Sender<()>,
}

/// The collector's service: appends what it is sent.
struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let received = flatten(request.into_inner());
        self.spans.lock().unwrap().extend(received);
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Every span of an export, with its resource's service.
fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = attributes(
            resource_spans
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default(),
        );
        let service = resource.get("service.name").cloned().unwrap_or_default();
        let version = resource.get("service.version").cloned().unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            out.push(ReceivedSpan {
                service: service.clone(),
                service_version: version.clone(),
                name: span.name,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                attributes: attributes(span.attributes),
            });
        }
    }
    out
}

/// Attributes as text: strings as they are, numbers and booleans printed.
fn attributes(kvs: Vec<KeyValue>) -> BTreeMap<String, String> {
    kvs.into_iter()
        .map(|kv| (kv.key, kv.value.map(text).unwrap_or_default()))
        .collect()
}

fn text(value: AnyValue) -> String {
    match value.value {
        Some(Value::StringValue(s)) => s,
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl OtlpReceiver {
    /// Serves on an ephemeral loopback port.
    pub async fn start() -> OtlpReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = TraceServiceServer::new(Collector {
            spans: spans.clone(),
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );
        OtlpReceiver {
            addr,
            spans,
            _stop: stop,
        }
    }

    /// The endpoint to export to, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits (up to `within`) for a span `wanted` accepts, and returns it;
    /// panics with every span received when none came.
    pub async fn until_span(
        &self,
        what: &str,
        within: Duration,
        wanted: impl Fn(&ReceivedSpan) -> bool,
    ) -> ReceivedSpan {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.spans().into_iter().find(|s| wanted(s)) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no span {what} within {within:?}; received:\n{:#?}",
                self.spans()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
