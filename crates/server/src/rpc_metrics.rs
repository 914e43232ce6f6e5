//! `jobfence_rpc_duration_seconds` (and `jobfence_transaction_conflict_calls_total`): a tower layer around every gRPC service
//! of the server, so no handler has to remember to time itself.
//!
//! A gRPC status travels in the response headers when the call fails before
//! any message ("trailers-only"), otherwise in the trailers at the end of the
//! body. The layer reads the headers first and else wraps the body to read
//! the trailers; a body dropped before its trailers (the client went away)
//! is recorded as CANCELLED. The latency is from the request to the status.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use jobfence_metrics::Metrics;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;
use tonic::Code;

/// Records every call's latency and status in [`Metrics`].
#[derive(Debug, Clone)]
pub struct RpcMetricsLayer {
    metrics: Metrics,
}

impl RpcMetricsLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        RpcMetricsLayer { metrics }
    }
}

impl<S> tower_layer::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`RpcMetricsLayer`] wraps around.
#[derive(Debug, Clone)]
pub struct RpcMetrics<S> {
    inner: S,
    metrics: Metrics,
}

/// What is needed to record one call once its status is known.
#[derive(Debug)]
struct Pending {
    metrics: Metrics,
    service: String,
    method: String,
    start: Instant,
}

impl Pending {
    fn record(self, code: Code) {
        let seconds = self.start.elapsed().as_secs_f64();
        self.metrics
            .rpc(&self.service, &self.method, code_name(code), seconds);
        // ABORTED is TRANSACTION_CONFLICT's code and no other reason's
        // (errors.proto): counted per call, beside the store's count of
        // transactions.
        if code == Code::Aborted {
            self.metrics.conflict_call(&self.method);
        }
    }
}

/// `SCREAMING_SNAKE` name of a status code, as the gRPC spec writes it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn status_in(headers: &http::HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(Code::from_i32)
}

/// `("jobfence.v1.JobCoordinator", "Claim")` from `/jobfence.v1.JobCoordinator/Claim`.
fn split_path(path: &str) -> (String, String) {
    let path = path.trim_start_matches('/');
    match path.split_once('/') {
        Some((s, m)) => (s.to_owned(), m.to_owned()),
        None => (path.to_owned(), String::new()),
    }
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for RpcMetrics<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes>,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let (service, method) = split_path(req.uri().path());
        let pending = Pending {
            metrics: self.metrics.clone(),
            service,
            method,
            start: Instant::now(),
        };
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = call.await?;
            let pending = match status_in(response.headers()) {
                Some(code) => {
                    pending.record(code);
                    None
                }
                None => Some(pending),
            };
            Ok(response.map(|inner| MeteredBody { inner, pending }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that records the call when its trailers pass by.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        pending: Option<Pending>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(p) = this.project().pending.take() {
                p.record(Code::Cancelled);
            }
        }
    }
}

impl<B: Body<Data = Bytes>> Body for MeteredBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(code) = f.trailers_ref().and_then(status_in) {
                    if let Some(p) = this.pending.take() {
                        p.record(code);
                    }
                }
            }
            Some(Err(_)) => {
                if let Some(p) = this.pending.take() {
                    p.record(Code::Internal);
                }
            }
            None => {
                // A body that ends without trailers carried no status.
                if let Some(p) = this.pending.take() {
                    p.record(Code::Unknown);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(metrics: &Metrics, method: &str, code: Code) {
        Pending {
            metrics: metrics.clone(),
            service: "jobfence.v1.JobCoordinator".into(),
            method: method.into(),
            start: Instant::now(),
        }
        .record(code);
    }

    #[test]
    fn every_call_answered_aborted_is_a_conflict_call() {
        let metrics = Metrics::new();
        for _ in 0..3 {
            answered(&metrics, "Complete", Code::Aborted);
        }
        answered(&metrics, "Complete", Code::Unavailable);
        answered(&metrics, "Claim", Code::Ok);
        let text = metrics.render();
        let calls: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("jobfence_transaction_conflict_calls_total{"))
            .collect();
        assert_eq!(
            calls,
            vec!["jobfence_transaction_conflict_calls_total{method=\"Complete\"} 3"]
        );
    }
}
