'use strict';
// The caller's trace context in each call's metadata (src/trace.js), with a
// stand-in for the optional @opentelemetry/api.

const test = require('node:test');
const assert = require('node:assert');
const grpc = require('@grpc/grpc-js');
const { callMetadata } = require('../src/trace');

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const SPAN_ID = '00f067aa0ba902b7';

function fakeApi({ propagator, spanContext }) {
  return {
    context: { active: () => ({}) },
    propagation: { inject: (_cx, carrier) => propagator && propagator(carrier) },
    trace: {
      getSpanContext: () => spanContext,
      isSpanContextValid: (sc) => sc.traceId !== '0'.repeat(32),
    },
  };
}

function token() {
  const md = new grpc.Metadata();
  md.set('authorization', 'Bearer t');
  return md;
}

test('without the package the metadata is the token alone', () => {
  const base = token();
  assert.strictEqual(callMetadata(base, null), base);
});

test('a registered propagator writes the headers', () => {
  const api = fakeApi({
    propagator: (c) => { c.traceparent = `00-${TRACE_ID}-${SPAN_ID}-01`; c.tracestate = 'vendor=v1'; },
  });
  const md = callMetadata(token(), api);
  assert.deepStrictEqual(md.get('traceparent'), [`00-${TRACE_ID}-${SPAN_ID}-01`]);
  assert.deepStrictEqual(md.get('tracestate'), ['vendor=v1']);
  assert.deepStrictEqual(md.get('authorization'), ['Bearer t']);
});

test('with the API alone the traceparent is written by hand', () => {
  const api = fakeApi({ spanContext: { traceId: TRACE_ID, spanId: SPAN_ID, traceFlags: 1 } });
  assert.deepStrictEqual(callMetadata(token(), api).get('traceparent'), [`00-${TRACE_ID}-${SPAN_ID}-01`]);
});

test('outside a trace nothing is added', () => {
  const base = token();
  assert.strictEqual(callMetadata(base, fakeApi({})), base);
  const invalid = { traceId: '0'.repeat(32), spanId: SPAN_ID, traceFlags: 0 };
  assert.strictEqual(callMetadata(base, fakeApi({ spanContext: invalid })), base);
});
