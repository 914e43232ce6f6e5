#!/usr/bin/env node
'use strict';
// A refund worker in Node, on jobfence-worker: the same reconcile-first
// protocol as the Rust one (src/refund_worker/handler.rs) and the Python one,
// against the fake payment provider's Stripe-style API (docs/fake-provider.md).
//
//   jobfence-node-refund-worker --coordinator 127.0.0.1:50051 \
//     --provider http://127.0.0.1:8099/ --worker-id node-1 --queue refunds
//
// operation_key is the idempotency key and the merchant reference; the
// attempt is never sent to the provider. EXECUTE sends the refund: a timeout
// or a cut connection is an unknown outcome (reconcile, never "not
// refunded"); a 503 did nothing (ask for a resend). RECONCILE looks the
// refund up: succeeded -> Complete; pending -> reconcile later; not found ->
// ask for a resend, which the coordinator allows only inside its window. A
// 429 (the provider's rate limit) did nothing: fail with the same next action
// (RETRY_EXECUTE for a send, RETRY_RECONCILE for a lookup), due after the
// Retry-After, and report it as provider_retry_after so the coordinator holds
// every worker's hand-outs for the provider until then. No client-side rate
// limiter.

const { parseArgs } = require('node:util');
const {
  WorkerClient, Disposition, credentialsFromEnv, AttemptSuperseded, JobNotRunning, OutcomeUnknown,
} = require('./index');

class Unknown extends Error {}
class NothingDone extends Error {}
class Refused extends Error {}
/** A 429: the provider's rate limit refused the request; nothing was done. */
class Throttled extends Error {
  constructor(message, retryAfterSeconds) {
    super(message);
    this.retryAfterSeconds = retryAfterSeconds;
  }
}

// A 429 without Retry-After counts as this (seconds); the coordinator
// accepts at most 24 h.
const DEFAULT_RETRY_AFTER = 1;
const MAX_RETRY_AFTER = 24 * 3600;

/**
 * The wait a 429 asked for, seconds: Retry-After-Ms (the fake provider's
 * precise one), else Retry-After as delta-seconds, else DEFAULT_RETRY_AFTER;
 * clamped to what the coordinator accepts. `headers`: a fetch Headers.
 */
function retryAfterSeconds(headers) {
  let wait = DEFAULT_RETRY_AFTER;
  for (const [name, scale] of [['retry-after-ms', 0.001], ['retry-after', 1]]) {
    const raw = headers.get(name);
    const value = raw === null || raw.trim() === '' ? NaN : Number(raw);
    if (Number.isFinite(value) && value >= 0) {
      wait = value * scale;
      break;
    }
  }
  return Math.min(Math.max(wait, 0.001), MAX_RETRY_AFTER);
}

function log(...words) {
  process.stderr.write(`${new Date().toISOString()} ${words.join(' ')}\n`);
}

class Provider {
  constructor(baseUrl, timeoutSeconds) {
    this.base = baseUrl.replace(/\/?$/, '/');
    this.timeoutMs = timeoutSeconds * 1000;
  }

  async send(url, init = {}) {
    let response;
    try {
      response = await fetch(url, { ...init, signal: AbortSignal.timeout(this.timeoutMs) });
    } catch (err) {
      const code = err.cause && err.cause.code;
      if (code === 'ECONNREFUSED') throw new NothingDone('connection refused');
      // A timeout, a reset, a cut: the request may have been processed.
      throw new Unknown(`${err.name}: ${code || err.message}`);
    }
    let text;
    try {
      text = await response.text();
    } catch (err) {
      throw new Unknown(`body cut: ${err.message}`);
    }
    if (response.status === 429) throw new Throttled('HTTP 429', retryAfterSeconds(response.headers));
    if (response.status >= 500) throw new NothingDone(`HTTP ${response.status}`);
    if (response.status >= 400) throw new Refused(`HTTP ${response.status}: ${text}`);
    try {
      return JSON.parse(text);
    } catch (err) {
      throw new Unknown(`bad JSON: ${err.message}`);
    }
  }

  createRefund(idempotencyKey, params) {
    return this.send(this.base + 'v1/refunds', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Idempotency-Key': idempotencyKey },
      body: JSON.stringify(params),
    });
  }

  async findByMerchantReference(reference) {
    const query = new URLSearchParams({ merchant_reference: reference });
    return (await this.send(`${this.base}v1/refunds?${query}`)).data;
  }
}

function throttled(disposition, call, err) {
  const why = `provider rate limit (429) on the ${call}: nothing was done; retry after ${err.retryAfterSeconds}s`;
  return ['throttled', [disposition, why, err.retryAfterSeconds]];
}

/**
 * ['complete', refund], ['fail', [disposition, why, delaySeconds]], or
 * ['throttled', [disposition, why, retryAfterSeconds]] when the provider's
 * rate limit refused the call.
 */
async function decide(job, provider) {
  let params;
  try {
    const p = JSON.parse(job.payload);
    if (p.payment_id === undefined || p.amount === undefined || p.currency === undefined) throw new Error('missing field');
    params = { payment_id: p.payment_id, amount: p.amount, currency: p.currency, merchant_reference: job.operationKey };
  } catch (err) {
    return ['fail', [Disposition.MANUAL_REVIEW, `bad refund payload: ${err.message}`, 0]];
  }
  if (job.nextAction === 'RECONCILE') {
    let found;
    try {
      found = await provider.findByMerchantReference(job.operationKey);
    } catch (err) {
      if (err instanceof Throttled) return throttled(Disposition.RETRY_RECONCILE, 'lookup', err);
      return ['fail', [Disposition.RETRY_RECONCILE, `lookup failed: ${err.message}`, 1]];
    }
    const done = found.filter((r) => r.status === 'succeeded');
    if (done.length) return ['complete', done[0]];
    if (found.some((r) => r.status === 'pending')) return ['fail', [Disposition.RETRY_RECONCILE, 'refund pending', 1]];
    if (found.length) return ['fail', [Disposition.FAILED, 'the provider failed the refund', 0]];
    return ['fail', [Disposition.RETRY_EXECUTE, 'not found at the provider; resend with the same idempotency key', 0.5]];
  }
  let refund;
  try {
    refund = await provider.createRefund(job.operationKey, params);
  } catch (err) {
    // Refused before anything was done: the same send, later.
    if (err instanceof Throttled) return throttled(Disposition.RETRY_EXECUTE, 'send', err);
    if (err instanceof NothingDone) return ['fail', [Disposition.RETRY_EXECUTE, `provider did nothing: ${err.message}`, 0.5]];
    if (err instanceof Refused) return ['fail', [Disposition.MANUAL_REVIEW, `provider refused: ${err.message}`, 0]];
    return ['fail', [Disposition.RETRY_RECONCILE, `outcome unknown, reconcile: ${err.message}`, 1]];
  }
  if (refund.status === 'succeeded') return ['complete', refund];
  if (refund.status === 'pending') return ['fail', [Disposition.RETRY_RECONCILE, `refund ${refund.id} pending`, 1]];
  return ['fail', [Disposition.FAILED, `the provider failed refund ${refund.id}`, 0]];
}

async function handle(job, provider) {
  const [action, arg] = await decide(job, provider);
  try {
    if (action === 'complete') {
      await job.complete(arg.id, JSON.stringify(arg));
      log(`job ${job.jobId} attempt ${job.attempt} completed with ${arg.id}`);
    } else if (action === 'throttled') {
      const [disposition, why, retryAfter] = arg;
      const out = await job.fail(disposition, why, retryAfter, { providerRetryAfterSeconds: retryAfter });
      log(`job ${job.jobId} attempt ${job.attempt}: ${why} -> ${out.applied} ${out.overrideReason}`);
    } else {
      const [disposition, why, delay] = arg;
      const out = await job.fail(disposition, why, delay);
      log(`job ${job.jobId} attempt ${job.attempt}: ${why} -> ${out.applied} ${out.overrideReason}`);
    }
  } catch (err) {
    if (err instanceof AttemptSuperseded || err instanceof JobNotRunning) {
      log(`job ${job.jobId} attempt ${job.attempt}: write refused, no longer the holder (${err.reason})`);
      return;
    }
    throw err;
  }
}

async function main() {
  const { values } = parseArgs({
    options: {
      coordinator: { type: 'string', default: '127.0.0.1:50051' },
      provider: { type: 'string', default: 'http://127.0.0.1:8099/' },
      'worker-id': { type: 'string', default: `node-worker-${process.pid}` },
      queue: { type: 'string', default: 'refunds' },
      'lease-seconds': { type: 'string', default: '30' },
      'provider-timeout': { type: 'string', default: '2' },
      concurrency: { type: 'string', default: '4' },
    },
  });
  const provider = new Provider(values.provider, Number(values['provider-timeout']));
  const client = new WorkerClient({
    // TLS and the token from JOBFENCE_TLS_CA, JOBFENCE_TOKEN_FILE, ...
    credentials: credentialsFromEnv(),
    target: values.coordinator, workerId: values['worker-id'], queue: values.queue,
    leaseSeconds: Number(values['lease-seconds']), timeoutSeconds: 5,
  });
  const stop = new AbortController();
  for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => stop.abort());
  log(`node refund worker ${values['worker-id']} started on ${values.coordinator}`);
  let handled = 0;
  await client.run(async (job) => {
    // Unclear writes (after the client's retries) leave the job leased: it
    // comes back after its lease through a takeover, which reconciles.
    await handle(job, provider).catch((err) => log(`job ${job.jobId}: write back failed after retries: ${err.message}`));
    handled += 1;
  }, {
    concurrency: Number(values.concurrency),
    waitSeconds: 5,
    signal: stop.signal,
    onClaimError: (err) => log(err instanceof OutcomeUnknown
      ? `claim outcome unknown, holding nothing: ${err.message}`
      : `claim failed: ${err.message}`),
  });
  client.close();
  log(`stopped after ${handled} jobs`);
}

if (require.main === module) {
  main().catch((err) => {
    log(`fatal: ${err.stack || err}`);
    process.exit(1);
  });
}

module.exports = {
  decide, handle, Provider, Throttled, retryAfterSeconds, DEFAULT_RETRY_AFTER, MAX_RETRY_AFTER,
};
