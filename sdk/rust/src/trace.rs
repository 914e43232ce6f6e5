//! The caller's trace on every call: with the cargo feature `otel`, the
//! W3C `traceparent` (and `tracestate`) of the current OpenTelemetry
//! context is sent with each call, so the coordinator's span of the call
//! (when it exports its spans, `serve --otlp-endpoint`) is a child of the
//! caller's span. The current context is the one a `tracing` span entered
//! under a `tracing-opentelemetry` layer makes current, or one attached
//! with OpenTelemetry's API. Without the feature, or outside a trace,
//! nothing is sent.

use tonic::metadata::MetadataMap;

/// Adds the current trace context to `metadata`, if there is one.
#[cfg(feature = "otel")]
pub(crate) fn inject(metadata: &mut MetadataMap) {
    use opentelemetry::trace::TraceContextExt;
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let Some((parent, state)) = headers(span.span_context()) else {
        return;
    };
    if let Ok(value) = parent.parse() {
        metadata.insert("traceparent", value);
    }
    if let Some(Ok(value)) = state.map(|s| s.parse()) {
        metadata.insert("tracestate", value);
    }
}

/// Without the feature `otel`: nothing.
#[cfg(not(feature = "otel"))]
pub(crate) fn inject(_metadata: &mut MetadataMap) {}

/// The `traceparent` of a valid span context (version 00: trace id, span
/// id, and the sampled flag), and its `tracestate` when it has one.
#[cfg(feature = "otel")]
fn headers(sc: &opentelemetry::trace::SpanContext) -> Option<(String, Option<String>)> {
    if !sc.is_valid() {
        return None;
    }
    let flags = sc.trace_flags() & opentelemetry::trace::TraceFlags::SAMPLED;
    let parent = format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), flags);
    let state = sc.trace_state().header();
    Some((parent, (!state.is_empty()).then_some(state)))
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };

    #[test]
    fn the_current_span_goes_out_as_traceparent() {
        let mut outside = MetadataMap::new();
        inject(&mut outside);
        assert!(outside.is_empty(), "no trace, no header");
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::from_key_value([("vendor", "v1")]).unwrap(),
        );
        let _current = opentelemetry::Context::new()
            .with_remote_span_context(sc)
            .attach();
        let mut inside = MetadataMap::new();
        inject(&mut inside);
        assert_eq!(
            inside.get("traceparent").unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(inside.get("tracestate").unwrap(), "vendor=v1");
    }
}
