'use strict';
// A provider's push-back reaches the coordinator: `fail` carries
// provider_retry_after, and the refund worker turns a provider 429 into a
// Fail with it. Against a real gRPC server in this process that records what
// it receives, and a real HTTP server that answers 429.

const test = require('node:test');
const assert = require('node:assert');
const http = require('node:http');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const jw = require('..');
const { protoRoot } = require('../src/client');
const refundWorker = require('../src/refund_worker');

/** A gRPC server with the coordinator's Fail only: records each request, answers it applied. */
async function recordingCoordinator(t) {
  const definition = protoLoader.loadSync('jobfence/v1/coordinator.proto', {
    includeDirs: [protoRoot()], keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  const Service = grpc.loadPackageDefinition(definition).jobfence.v1.JobCoordinator;
  const requests = [];
  const server = new grpc.Server();
  server.addService(Service.service, {
    Fail(call, callback) {
      requests.push(call.request);
      const { jobId, attempt } = call.request;
      callback(null, { job: { jobId, attempt }, applied: call.request.disposition });
    },
  });
  const port = await new Promise((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
  });
  const client = new jw.WorkerClient({ target: `127.0.0.1:${port}`, workerId: 'node-w', queue: 'refunds' });
  t.after(() => {
    client.close();
    server.forceShutdown();
  });
  return { client, requests };
}

function claimed(client, nextAction = 'NEXT_ACTION_EXECUTE') {
  const payload = JSON.stringify({ payment_id: 'pay_1', amount: 500, currency: 'twd' });
  return new jw.ClaimedJob(client, {
    job: { jobId: 7, attempt: 3, operationKey: 'refund-pay_1-500', payload, nextAction },
    takeover: false,
    observations: [],
  });
}

/** An HTTP server answering every request 429, as the fake provider past its limit. */
async function tooManyRequests(t, headers = { 'Retry-After': '3', 'Retry-After-Ms': '2500' }) {
  const server = http.createServer((req, res) => {
    req.resume();
    res.writeHead(429, { ...headers, 'Content-Type': 'application/json' });
    res.end('{"error":{"type":"invalid_request_error","code":"rate_limit","message":"slow down"}}');
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => server.close());
  return new refundWorker.Provider(`http://127.0.0.1:${server.address().port}/`, 5);
}

test('fail sends providerRetryAfterSeconds as provider_retry_after, and nothing unless given', async (t) => {
  const { client, requests } = await recordingCoordinator(t);
  const job = claimed(client);
  const out = await job.fail(jw.Disposition.RETRY_EXECUTE, 'provider said 429', 2.5, { providerRetryAfterSeconds: 2.5 });
  assert.strictEqual(out.applied, jw.Disposition.RETRY_EXECUTE);
  await claimed(client).fail(jw.Disposition.RETRY_RECONCILE, 'lookup timed out', 1);
  const [throttled, plain] = requests;
  assert.deepStrictEqual([throttled.jobId, throttled.attempt], [7, 3]);
  assert.deepStrictEqual(throttled.providerRetryAfter, { seconds: 2, nanos: 500000000 });
  assert.deepStrictEqual(throttled.retryDelay, { seconds: 2, nanos: 500000000 });
  assert.strictEqual(plain.providerRetryAfter, null, 'unset unless given');
});

for (const [nextAction, disposition] of [
  ['NEXT_ACTION_EXECUTE', 'FAIL_DISPOSITION_RETRY_EXECUTE'],
  ['NEXT_ACTION_RECONCILE', 'FAIL_DISPOSITION_RETRY_RECONCILE'],
]) {
  test(`the refund worker reports a 429 to a ${nextAction} job as ${disposition} with provider_retry_after`, async (t) => {
    const { client, requests } = await recordingCoordinator(t);
    const provider = await tooManyRequests(t);
    await refundWorker.handle(claimed(client, nextAction), provider);
    assert.strictEqual(requests.length, 1);
    const [request] = requests;
    assert.strictEqual(request.disposition, disposition);
    // Retry-After-Ms wins over the whole seconds of Retry-After.
    assert.deepStrictEqual(request.providerRetryAfter, { seconds: 2, nanos: 500000000 });
    assert.deepStrictEqual(request.retryDelay, request.providerRetryAfter);
    assert.match(request.error, /429/);
  });
}

test('the Retry-After a 429 asked for', () => {
  const wait = (h) => refundWorker.retryAfterSeconds(new Headers(h));
  assert.strictEqual(wait({ 'Retry-After': '3' }), 3);
  assert.strictEqual(wait({ 'Retry-After': '3', 'Retry-After-Ms': '120' }), 0.12);
  assert.strictEqual(wait({}), refundWorker.DEFAULT_RETRY_AFTER);
  assert.strictEqual(wait({ 'Retry-After': 'Wed, 21 Oct 2015 07:28:00 GMT' }), refundWorker.DEFAULT_RETRY_AFTER);
  assert.strictEqual(wait({ 'Retry-After': '0' }), 0.001, 'positive, as the coordinator wants');
  assert.strictEqual(wait({ 'Retry-After': '1e9' }), refundWorker.MAX_RETRY_AFTER);
});
