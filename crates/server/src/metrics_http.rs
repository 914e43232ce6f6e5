//! The `/metrics` HTTP endpoint (`--metrics-listen`): plain HTTP/1.1 on its
//! own port, so Prometheus scrapes it without speaking gRPC and it can be
//! firewalled apart from the API. It also answers `GET /healthz` with the
//! gRPC health service's status (200 SERVING, 503 otherwise), for load
//! balancers that check over plain HTTP (HAProxy, see docs/operating.md).

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jobfence_metrics::Metrics;
use jobfence_store::shards::Shards;
use std::convert::Infallible;
use std::future::Future;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::ServingStatus;

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn respond(
    metrics: &Metrics,
    shards: &Shards,
    health: &watch::Receiver<ServingStatus>,
    req: &http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    let builder = http::Response::builder();
    match (req.method(), req.uri().path()) {
        (&http::Method::GET, "/metrics") => builder
            .header(http::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(Full::new(Bytes::from({
                jobfence_core::gauges::read_stores(shards, metrics);
                metrics.render()
            }))),
        (&http::Method::GET | &http::Method::HEAD, "/healthz") => {
            let status = *health.borrow();
            builder
                .status(if status == ServingStatus::Serving {
                    http::StatusCode::OK
                } else {
                    http::StatusCode::SERVICE_UNAVAILABLE
                })
                .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                // The gRPC health service's own names (SERVING,
                // NOT_SERVING), as grpcurl shows them.
                .body(Full::new(Bytes::from(format!(
                    "{}\n",
                    tonic_health::pb::health_check_response::ServingStatus::from(status)
                        .as_str_name()
                ))))
        }
        (&http::Method::GET, _) => builder
            .status(http::StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"try /metrics or /healthz\n"))),
        _ => builder
            .status(http::StatusCode::METHOD_NOT_ALLOWED)
            .body(Full::new(Bytes::new())),
    }
    .expect("a response from static parts")
}

/// Serves `GET /metrics` and `GET /healthz` (from `health`) on `listener`
/// until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    shards: Shards,
    health: watch::Receiver<ServingStatus>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        let shards = shards.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&metrics, &shards, &health, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "metrics connection ended");
            }
        });
    }
}
