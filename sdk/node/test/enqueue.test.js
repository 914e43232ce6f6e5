'use strict';
// enqueue and enqueueBatch send a job's fairness key and priority (and
// leave them out when not given: the coordinator's defaults), against a
// real gRPC server in this process that records what it receives.

const test = require('node:test');
const assert = require('node:assert');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const jw = require('..');
const { protoRoot } = require('../src/client');

/** A gRPC server with the coordinator's Enqueue and EnqueueBatch: records each request, answers with the job it names. */
async function recordingCoordinator(t) {
  const definition = protoLoader.loadSync('jobfence/v1/coordinator.proto', {
    includeDirs: [protoRoot()], keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  const Service = grpc.loadPackageDefinition(definition).jobfence.v1.JobCoordinator;
  const requests = [];
  const job = (r, jobId) => ({
    jobId, queue: r.queue, operationKey: r.operationKey, priority: r.priority || 5, fairnessKey: r.fairnessKey,
  });
  const server = new grpc.Server();
  server.addService(Service.service, {
    Enqueue(call, callback) {
      requests.push(call.request);
      callback(null, { job: job(call.request, 1), created: true });
    },
    EnqueueBatch(call, callback) {
      requests.push(call.request);
      callback(null, { results: call.request.items.map((r, i) => ({ enqueued: { job: job(r, i + 2), created: true } })) });
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

test('enqueue sends the fairness key and the priority, and the job says them', async (t) => {
  const { client, requests } = await recordingCoordinator(t);
  const { job, created } = await client.enqueue('refunds', 'refund-1', '{}', { fairnessKey: 'merchant-7', priority: 8 });
  assert.deepStrictEqual([requests[0].fairnessKey, requests[0].priority], ['merchant-7', 8]);
  assert.deepStrictEqual([job.fairnessKey, job.priority, created], ['merchant-7', 8, true]);
  await client.enqueue('refunds', 'refund-2', '{}', { delaySeconds: 30 });
  assert.deepStrictEqual([requests[1].fairnessKey, requests[1].priority, requests[1].delay.seconds], ['', 0, 30]);
});

test('enqueueBatch sends each item with its own options', async (t) => {
  const { client, requests } = await recordingCoordinator(t);
  const results = await client.enqueueBatch([
    { queue: 'refunds', operationKey: 'refund-3', payload: '{}', fairnessKey: 'merchant-8', priority: 2 },
    { queue: 'refunds', operationKey: 'refund-4', payload: '{}' },
  ]);
  const sent = requests[0].items.map((r) => [r.operationKey, r.fairnessKey, r.priority]);
  assert.deepStrictEqual(sent, [['refund-3', 'merchant-8', 2], ['refund-4', '', 0]]);
  assert.deepStrictEqual(results.map((r) => r.enqueued.job.priority), [2, 5]);
});
