//! The W3C trace context of a call (`traceparent`, `tracestate`): a tower
//! layer that reads it from the request's headers and makes it the current
//! OpenTelemetry context while the call runs, so the RPC's span (made by
//! the handler's `#[instrument]`, with no `tracing` span above it) is a
//! child of the caller's span, in the caller's trace.
//!
//! Only added when spans are exported (`serve --otlp-endpoint`,
//! [`OpsOptions::trace_context`](crate::OpsOptions::trace_context)):
//! without it no header is read and no context is attached.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{FutureExt, WithContext};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::task::{Context, Poll};

/// Makes each call's span a child of the `traceparent` its caller sent.
#[derive(Debug, Clone, Default)]
pub struct TraceContextLayer {
    propagator: TraceContextPropagator,
}

impl TraceContextLayer {
    /// The layer, reading W3C trace context headers.
    pub fn new() -> Self {
        TraceContextLayer::default()
    }
}

impl<S> tower_layer::Layer<S> for TraceContextLayer {
    type Service = TraceContext<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TraceContext {
            inner,
            propagator: self.propagator.clone(),
        }
    }
}

/// The service [`TraceContextLayer`] wraps around.
#[derive(Debug, Clone)]
pub struct TraceContext<S> {
    inner: S,
    propagator: TraceContextPropagator,
}

/// The headers of a request, as the propagator reads them.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

impl<S, B> tower_service::Service<http::Request<B>> for TraceContext<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = WithContext<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // Without a (valid) header: an empty context, so the RPC's span
        // starts a trace of its own.
        let remote = self.propagator.extract(&Headers(req.headers()));
        // Current while the inner services are called too, in case one
        // makes its span before its future is first polled.
        let call = {
            let _current = remote.clone().attach();
            self.inner.call(req)
        };
        call.with_context(remote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn a_traceparent_header_becomes_the_remote_parent() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                .parse()
                .unwrap(),
        );
        let cx = TraceContextPropagator::new().extract(&Headers(&headers));
        let span = cx.span();
        let parent = span.span_context();
        assert!(parent.is_remote() && parent.is_sampled());
        assert_eq!(
            parent.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(parent.span_id().to_string(), "b7ad6b7169203331");
        // OpenTelemetry Python sets the W3C level 2 "random" bit too.
        headers.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03"
                .parse()
                .unwrap(),
        );
        let cx = TraceContextPropagator::new().extract(&Headers(&headers));
        assert!(cx.span().span_context().is_sampled());
        let none = TraceContextPropagator::new().extract(&Headers(&http::HeaderMap::new()));
        assert!(!none.span().span_context().is_valid());
    }
}
