'use strict';
// WorkerClient hands out ClaimedJob handles; every write goes through the
// handle, which carries the attempt (fencing token) it was issued.

const fs = require('node:fs');
const net = require('node:net');
const crypto = require('node:crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const errors = require('./errors');
const { callMetadata } = require('./trace');
const { protoRoot } = require('./proto');
const { version: VERSION } = require('../package.json');


let service = null;
function coordinatorService() {
  if (!service) {
    const definition = protoLoader.loadSync('jobfence/v1/coordinator.proto', {
      includeDirs: [protoRoot()],
      keepCase: false,
      longs: Number,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    service = grpc.loadPackageDefinition(definition).jobfence.v1.JobCoordinator;
  }
  return service;
}

/** How Fail disposes of the job (the API's FailDisposition). */
const Disposition = Object.freeze({
  RETRY_RECONCILE: 'FAIL_DISPOSITION_RETRY_RECONCILE',
  RETRY_EXECUTE: 'FAIL_DISPOSITION_RETRY_EXECUTE',
  FAILED: 'FAIL_DISPOSITION_FAILED',
  MANUAL_REVIEW: 'FAIL_DISPOSITION_MANUAL_REVIEW',
});

/**
 * How patiently a call that is safe to repeat is retried: for up to `budget`
 * seconds from its first try (no retry starts whose wait would end past it;
 * 0 turns retrying off), with a backoff that doubles from `initial` up to
 * `maximum` seconds, half of it random (equal jitter). The default, 30 s
 * from 50 ms up to 2 s, is the same in every jobfence client and outlasts a
 * 10-second database outage.
 */
class RetryPolicy {
  constructor({ budget = 30, initial = 0.05, maximum = 2.0 } = {}) {
    Object.assign(this, { budget, initial, maximum });
  }

  backoff(retry) {
    const ceiling = Math.min(this.maximum, this.initial * 2 ** Math.max(0, retry - 1));
    return ceiling / 2 + Math.random() * (ceiling / 2);
  }

  /** Seconds before retry `retry` after `err`: the backoff, or the server's retry-after hint (RetryInfo) when longer. */
  wait(retry, err) {
    return Math.max(this.backoff(retry), (err && err.retryAfterSeconds) || 0);
  }

  /** `wait(retry, err)`, or null when it would end past the budget (`elapsed`: seconds since the first try). */
  nextWait(retry, err, elapsed) {
    const wait = this.wait(retry, err);
    return elapsed + wait > this.budget ? null : wait;
  }
}

/**
 * `worker:<workerId>:<providerReference>`, or `worker-sha256:<hex>` of both
 * when longer than 255 bytes: the key every jobfence SDK derives.
 */
function observationDedupKey(workerId, providerReference) {
  const plain = `worker:${workerId}:${providerReference}`;
  if (Buffer.byteLength(plain) <= 255) return plain;
  const h = crypto.createHash('sha256');
  h.update(workerId);
  h.update(Buffer.from([0]));
  h.update(providerReference);
  return 'worker-sha256:' + h.digest('hex');
}

function duration(seconds) {
  const whole = Math.floor(seconds);
  return { seconds: whole, nanos: Math.round((seconds - whole) * 1e9) };
}

const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));

/**
 * TLS and bearer token from the environment every jobfence client reads:
 * JOBFENCE_TLS_CA (the CA that signed the coordinator's certificate: TLS),
 * JOBFENCE_TLS_CLIENT_CERT and JOBFENCE_TLS_CLIENT_KEY (mutual TLS), and
 * JOBFENCE_TOKEN_FILE (a file whose first line is the token) or
 * JOBFENCE_TOKEN.
 */
function credentialsFromEnv(env = process.env) {
  const creds = {};
  if (env.JOBFENCE_TLS_CA) creds.tlsCaPem = fs.readFileSync(env.JOBFENCE_TLS_CA);
  const [cert, key] = [env.JOBFENCE_TLS_CLIENT_CERT, env.JOBFENCE_TLS_CLIENT_KEY];
  if (Boolean(cert) !== Boolean(key)) {
    throw new Error('set both JOBFENCE_TLS_CLIENT_CERT and JOBFENCE_TLS_CLIENT_KEY, or neither');
  }
  if (cert) {
    creds.tlsClientCertPem = fs.readFileSync(cert);
    creds.tlsClientKeyPem = fs.readFileSync(key);
  }
  if (env.JOBFENCE_TOKEN_FILE) {
    const token = fs.readFileSync(env.JOBFENCE_TOKEN_FILE, 'utf8').split('\n')[0].trim();
    if (!token) throw new Error(`the token file ${env.JOBFENCE_TOKEN_FILE} is empty`);
    creds.token = token;
  } else if (env.JOBFENCE_TOKEN) {
    creds.token = env.JOBFENCE_TOKEN;
  }
  return creds;
}

/**
 * grpc-js channel credentials: TLS with a CA, cleartext without. The TLS
 * server name (SNI) is sent only for a host name: grpc-js sends the
 * target's host whatever it is, and Node warns (DEP0123, RFC 6066) at every
 * connection to an IP address such as 127.0.0.1. Without it, Node checks
 * the certificate against the address itself (its IP SAN), as before.
 */
function channelCredentials(creds = {}) {
  if (!creds.tlsCaPem) return grpc.credentials.createInsecure();
  const ssl = grpc.credentials.createSsl(creds.tlsCaPem, creds.tlsClientKeyPem || null, creds.tlsClientCertPem || null);
  const create = ssl._createSecureConnector;
  if (typeof create !== 'function') return ssl; // another grpc-js: left as it is
  ssl._createSecureConnector = function createSecureConnector(...args) {
    const connector = create.apply(this, args);
    const options = connector && connector.connectionOptions;
    if (options && net.isIP(options.servername || '')) delete options.servername;
    return connector;
  };
  return ssl;
}

class WorkerClient {
  /**
   * target: `host:port`; leaseSeconds: asked for on every Claim/Takeover
   * (DB clock, within the server's bounds); timeoutSeconds: one RPC's deadline.
   */
  constructor({ target, workerId, queue, leaseSeconds = 30, timeoutSeconds = 10, retry, credentials } = {}) {
    if (!target || !workerId || !queue) throw new TypeError('target, workerId and queue are required');
    const Service = coordinatorService();
    this.workerId = workerId;
    this.queue = queue;
    this.leaseSeconds = leaseSeconds;
    this.timeoutSeconds = timeoutSeconds;
    this.retry = retry instanceof RetryPolicy ? retry : new RetryPolicy(retry);
    /** Calls sent again because the answer said nothing was applied (or, for a write, that its outcome was unknown). */
    this.retries = 0;
    // The user-agent names this client first (jobfence-node/VERSION): the
    // coordinator's workers view shows it.
    this.stub = new Service(target.replace(/^https?:\/\//, ''), channelCredentials(credentials), {
      'grpc.primary_user_agent': `jobfence-node/${VERSION}`,
    });
    // The token goes on every call as metadata (it works on a cleartext
    // channel too, for a coordinator behind a TLS-terminating proxy), with
    // the caller's trace context when it has one (src/trace.js).
    this.metadata = new grpc.Metadata();
    if (credentials && credentials.token) this.metadata.set('authorization', `Bearer ${credentials.token}`);
  }

  close() {
    this.stub.close();
  }

  unary(method, request, extraSeconds = 0, signal = undefined) {
    const deadline = new Date(Date.now() + (this.timeoutSeconds + extraSeconds) * 1000);
    return new Promise((resolve, reject) => {
      let header = null;
      const call = this.stub[method](request, callMetadata(this.metadata), { deadline }, (err, response) => {
        signal?.removeEventListener('abort', cancel);
        // A refusal comes trailers-only: the version is among either.
        const refused = errors.apiVersionRefusal(header, err && err.metadata);
        if (refused) reject(refused);
        else if (err) reject(errors.fromServiceError(err));
        else resolve(response);
      });
      call.on('metadata', (md) => { header = md; });
      const cancel = () => call.cancel();
      signal?.addEventListener('abort', cancel, { once: true });
    });
  }

  async call(method, request, retryable, extraSeconds = 0, signal = undefined) {
    const started = Date.now();
    for (let tries = 1; ; tries++) {
      try {
        return await this.unary(method, request, extraSeconds, signal);
      } catch (err) {
        const wait = retryable(err) && !signal?.aborted
          ? this.retry.nextWait(tries, err, (Date.now() - started) / 1000) : null;
        if (wait === null) throw err;
        this.retries += 1;
        await sleep(wait);
      }
    }
  }

  /**
   * Claims up to maxJobs due jobs; resolves to their handles (maybe none).
   * With waitSeconds the coordinator holds the call until a job is due (a
   * long poll); `signal` cuts it short. Rejects with OutcomeUnknown when the
   * claim may have committed unheard (a cut one included): hold nothing
   * then; its jobs come back after their lease through a takeover that
   * reconciles first.
   */
  async claim(maxJobs = 1, { waitSeconds = 0, signal } = {}) {
    const request = { queue: this.queue, workerId: this.workerId, maxJobs, lease: duration(this.leaseSeconds) };
    if (waitSeconds > 0) request.wait = duration(waitSeconds);
    const response = await this.call('Claim', request, errors.retryableClaim, waitSeconds, signal);
    return response.jobs.map((c) => new ClaimedJob(this, c));
  }

  /** Takes over one job whose lease expired; it starts with RECONCILE. */
  async takeover(jobId) {
    const request = { jobId, workerId: this.workerId, lease: duration(this.leaseSeconds) };
    const response = await this.call('Takeover', request, errors.retryableClaim);
    return new ClaimedJob(this, response.claimed);
  }

  /** { job, observations }. A read decides nothing about ownership. */
  async getJob(jobId) {
    const response = await this.call('GetJob', { jobId }, errors.retryableWrite);
    return { job: response.job, observations: response.observations };
  }

  /**
   * Adds a job, idempotent on (queue, operationKey): { job, created }.
   * `fairnessKey` (a merchant, a tenant; at most 128 bytes, not blank):
   * within a queue and a priority, claims go round-robin across the keys.
   * `priority`: 1 (lowest) to 9 (most urgent); unset or 0 is the default,
   * 5 (docs/design.md rule 18). The job returned says what it was given
   * (job.priority, job.fairnessKey); a bad value is refused with
   * InvalidRequest naming the field.
   */
  async enqueue(queue, operationKey, payload, { delaySeconds = 0, fairnessKey, priority } = {}) {
    const request = enqueueRequest({
      queue, operationKey, payload, delaySeconds, fairnessKey, priority,
    });
    const response = await this.call('Enqueue', request, errors.retryableWrite);
    return { job: response.job, created: response.created };
  }

  /**
   * Enqueues [{queue, operationKey, payload, delaySeconds?, fairnessKey?,
   * priority?}] in one transaction; one result per item, in order (each
   * `enqueued` or an `error` for that item alone).
   */
  async enqueueBatch(items) {
    const response = await this.call('EnqueueBatch', { items: items.map(enqueueRequest) }, errors.retryableWrite);
    return response.results;
  }

  /**
   * Claims and handles jobs until `signal` aborts, at most `concurrency` at
   * once, claiming only for free slots (long polls of `waitSeconds`). A job
   * the handler leaves without a write that settled it is released with
   * RETRY_RECONCILE: the handler may have reached the provider. A claim
   * that failed after the client's retries (OutcomeUnknown: hold nothing;
   * Unavailable) goes to `onClaimError` (by default a line on stderr),
   * then the loop backs off and claims again. A claim refused for who the caller is (Denied: no or a
   * bad credential, another queue's, a role without Claim) or as an
   * InvalidRequest cannot succeed by asking again: the loop stops
   * claiming, lets the handlers in flight finish, and `run` rejects with
   * that error.
   */
  async run(handler, {
    concurrency = 1, waitSeconds = 10, signal,
    onClaimError = (err) => console.error(`jobfence: claim failed, claiming again: ${err.message}`),
  } = {}) {
    const inFlight = new Set();
    let failures = 0;
    let fatal = null;
    let stopped = false;
    while (!signal?.aborted && !fatal) {
      if (inFlight.size >= concurrency) {
        await Promise.race(inFlight);
        continue;
      }
      let jobs;
      try {
        jobs = await this.claim(concurrency - inFlight.size, { waitSeconds, signal });
        failures = 0;
      } catch (err) {
        if (signal?.aborted) break;
        if (err instanceof errors.NotAuthorized || err instanceof errors.InvalidRequest) {
          fatal = err;
          break;
        }
        if (onClaimError) onClaimError(err);
        failures += 1;
        await sleep(this.retry.backoff(failures));
        continue;
      }
      for (const job of jobs) {
        // Its Complete or Fail asks for the next job for the slot it frees
        // (docs/design.md rule 16); the handler then runs on that one.
        job.nextAsk = nextAsk(this, () => signal?.aborted || stopped);
        const task = (async () => {
          for (let current = job; current; current = current.takeNextJob()) {
            await handleOne(handler, current);
          }
        })();
        inFlight.add(task);
        task.finally(() => inFlight.delete(task));
      }
    }
    // Stopped claiming: the handlers in flight finish, asking for no next job.
    stopped = true;
    await Promise.allSettled(inFlight);
    if (fatal) throw fatal;
  }
}

/** What a handle's Complete and Fail ask for: one job of the client's queue, no long poll. */
function nextAsk(client, stopping) {
  return {
    request: {
      queue: client.queue, workerId: client.workerId, maxJobs: 1, lease: duration(client.leaseSeconds),
    },
    stopping,
  };
}

/** Runs the handler on one job; releases it with RETRY_RECONCILE when the handler left it unsettled. */
async function handleOne(handler, job) {
  let why = 'handler returned without writing back';
  try {
    await handler(job);
  } catch (err) {
    why = `handler failed: ${err && err.message}`;
  }
  if (!job.settled) {
    await job.fail(Disposition.RETRY_RECONCILE, why, 1).catch(() => {});
  }
}

/** The EnqueueRequest of one job: its options are sent when given. */
function enqueueRequest({
  queue, operationKey, payload, delaySeconds = 0, fairnessKey, priority,
}) {
  const request = { queue, operationKey, payload };
  if (delaySeconds > 0) request.delay = duration(delaySeconds);
  if (fairnessKey !== undefined && fairnessKey !== null) request.fairnessKey = fairnessKey;
  if (priority !== undefined && priority !== null) request.priority = priority;
  return request;
}

class ClaimedJob {
  constructor(client, claimed) {
    this.client = client;
    this.job = claimed.job;
    this.takeover = claimed.takeover;
    this.observations = claimed.observations;
    /** True once a write told this handle it no longer holds the job. */
    this.settled = false;
    this.nextAsk = null;
    this.handed = [];
    Object.defineProperty(this, 'attemptIssued', { value: claimed.job.attempt });
  }

  /**
   * Makes this handle's complete and fail also claim the worker's next job
   * of its queue (the client's queue, lease and worker id) in the same call
   * and transaction (docs/design.md rule 16); take it with takeNextJob()
   * after the write. run() does this for every job it hands to a handler.
   * Each half answers for itself: a write refused as superseded still
   * brings its next job (the error is the write's); a write whose outcome
   * is unknown brings none, and the client's retry of it is answered as a
   * replay, which claims nothing.
   */
  askForNextJob() {
    this.nextAsk = nextAsk(this.client, () => false);
  }

  /** The next job a write-back of this handle brought (asking for its own the same way), or null. */
  takeNextJob() {
    const claimed = this.handed.shift();
    if (!claimed) return null;
    const next = new ClaimedJob(this.client, claimed);
    next.nextAsk = this.nextAsk;
    return next;
  }

  withNext(request) {
    if (this.nextAsk && !this.nextAsk.stopping()) request.next = this.nextAsk.request;
    return request;
  }

  /** Keeps the next jobs of a write's answer; throws the write's refusal, if any. */
  answered(response) {
    if (!response.next) return;
    this.handed.push(...(response.next.jobs || []));
    if (response.next.writeRefused) throw errors.fromRefusal(response.next.writeRefused);
  }

  get jobId() { return this.job.jobId; }

  /** THE idempotency key to send to the provider; never built from the attempt. */
  get operationKey() { return this.job.operationKey; }

  /** The fencing token this handle presents; for logs only. */
  get attempt() { return this.attemptIssued; }

  get payload() { return this.job.payload; }

  /** 1 (lowest) to 9 (most urgent); 5 unless the job's enqueue asked for another (docs/design.md rule 18). */
  get priority() { return this.job.priority; }

  /** The fairness key the job was enqueued with (a merchant, a tenant); '' when it was given none. */
  get fairnessKey() { return this.job.fairnessKey; }

  /** 'EXECUTE' or 'RECONCILE' (always RECONCILE after a takeover). */
  get nextAction() { return this.job.nextAction.replace(/^NEXT_ACTION_/, ''); }

  refused(err) {
    if (err instanceof errors.AttemptSuperseded || err instanceof errors.JobNotRunning
      || err instanceof errors.JobNotFound) {
      this.settled = true;
    }
    return err;
  }

  /**
   * Marks the job succeeded. When refused as AttemptSuperseded or
   * JobNotRunning with a provider reference, the result is recorded as an
   * observation (source WORKER, outcome SUCCEEDED) and the error says
   * observationRecorded = true.
   */
  async complete(providerReference, result = '') {
    const request = this.withNext({ jobId: this.jobId, attempt: this.attempt, providerReference, result });
    let response;
    try {
      response = await this.client.call('Complete', request, errors.retryableWrite);
      this.answered(response);
    } catch (err) {
      if (providerReference && (err instanceof errors.AttemptSuperseded || err instanceof errors.JobNotRunning)) {
        err.observationRecorded = await this.recordObservation(
          'SUCCEEDED', providerReference, result, observationDedupKey(this.client.workerId, providerReference),
        ).then(() => true, () => false);
      }
      throw this.refused(err);
    }
    this.job = response.job;
    this.settled = true;
    return { replayed: response.replayed, job: response.job };
  }

  /**
   * Reports a failure with a Disposition; `error` is required. Set
   * `providerRetryAfterSeconds` when the provider pushed back (HTTP 429, or
   * 503 with Retry-After) to how long it asked to wait (positive, at most
   * 24 h): the coordinator then hands out nothing for the provider until
   * then, on every coordinator; the job is disposed of as asked (a
   * throttled send was not processed: RETRY_EXECUTE).
   */
  async fail(disposition, error, retryDelaySeconds = 0, { providerRetryAfterSeconds } = {}) {
    const request = {
      jobId: this.jobId, attempt: this.attempt, disposition, error, retryDelay: duration(retryDelaySeconds),
    };
    if (providerRetryAfterSeconds !== undefined && providerRetryAfterSeconds !== null) {
      request.providerRetryAfter = duration(providerRetryAfterSeconds);
    }
    this.withNext(request);
    let response;
    try {
      response = await this.client.call('Fail', request, errors.retryableWrite);
      this.answered(response);
    } catch (err) {
      throw this.refused(err);
    }
    this.job = response.job;
    this.settled = true;
    return {
      replayed: response.replayed, job: response.job, applied: response.applied, overrideReason: response.overrideReason,
    };
  }

  /** Extends the lease from now (DB clock); never shortens it. */
  async renewLease(leaseSeconds) {
    const request = { jobId: this.jobId, attempt: this.attempt, lease: duration(leaseSeconds) };
    let response;
    try {
      response = await this.client.call('RenewLease', request, errors.retryableWrite);
    } catch (err) {
      throw this.refused(err);
    }
    this.job = response.job;
    return { replayed: response.replayed, job: response.job };
  }

  /**
   * Records evidence (outcome like 'SUCCEEDED'), allowed from any attempt,
   * stale included; never changes the job. dedupKey is unique per job.
   */
  async recordObservation(outcome, providerReference, body, dedupKey) {
    const request = {
      jobId: this.jobId, attempt: this.attempt, source: 'OBSERVATION_SOURCE_WORKER',
      outcome: 'OBSERVATION_OUTCOME_' + outcome, providerReference, body, dedupKey,
    };
    const response = await this.client.call('RecordObservation', request, errors.retryableWrite);
    return { observation: response.observation, duplicate: response.duplicate };
  }
}

module.exports = {
  WorkerClient, ClaimedJob, Disposition, RetryPolicy, observationDedupKey, protoRoot, credentialsFromEnv,
};
