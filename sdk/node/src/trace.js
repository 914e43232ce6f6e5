'use strict';
// The caller's trace on every call: when the optional package
// @opentelemetry/api is installed and the calling code runs inside a trace,
// its context goes with the call, as the registered propagator writes it
// (W3C traceparent and tracestate with the OpenTelemetry SDK), else as a
// W3C traceparent written here. The coordinator's span of the call is then
// a child of the caller's (`jobfence serve --otlp-endpoint`). Without the
// package, or outside a trace, the metadata is the token's alone.

let installed = null;
try {
  installed = require('@opentelemetry/api');
} catch {
  installed = null;
}

/** `00-<trace id>-<span id>-<flags>` of a valid span context, else null. */
function traceparent(api, spanContext) {
  if (!spanContext || !api.trace.isSpanContextValid(spanContext)) return null;
  const flags = (spanContext.traceFlags & 1).toString(16).padStart(2, '0');
  return `00-${spanContext.traceId}-${spanContext.spanId}-${flags}`;
}

/** The metadata of one call: `base` (a grpc.Metadata) with the active trace context, if any. */
function callMetadata(base, api = installed) {
  if (!api) return base;
  const active = api.context.active();
  const carrier = {};
  api.propagation.inject(active, carrier);
  if (Object.keys(carrier).length === 0) {
    // No propagator registered (the API alone): the W3C header by hand.
    const parent = traceparent(api, api.trace.getSpanContext(active));
    if (parent) carrier.traceparent = parent;
  }
  const keys = Object.keys(carrier);
  if (keys.length === 0) return base;
  const metadata = base.clone();
  for (const key of keys) metadata.set(key.toLowerCase(), String(carrier[key]));
  return metadata;
}

module.exports = { callMetadata };
