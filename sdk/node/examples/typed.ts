// The public API of jobfence-worker as a TypeScript user writes it (the
// worker of docs/workers.md, the handle's writes, the typed errors). Not
// run: it is type-checked against src/index.d.ts with `npm run typecheck`
// (tsc --noEmit --strict), so a declaration that drifts from the API as
// docs/workers.md uses it fails there.

import {
  ApiVersionUnsupported,
  API_MAJOR,
  API_VERSION_HEADER,
  AttemptSuperseded,
  ClaimedJob,
  credentialsFromEnv,
  Denied,
  Disposition,
  EnqueueItem,
  FailWritten,
  Handler,
  JobNotRunning,
  NotAuthorized,
  observationDedupKey,
  OutcomeUnknown,
  REASONS,
  RetryPolicy,
  RunOptions,
  Unavailable,
  WorkerClient,
  Written,
} from '..';

const client = new WorkerClient({
  target: process.env.JOBFENCE_COORDINATOR || '127.0.0.1:50051',
  // TLS and the bearer token: JOBFENCE_TLS_CA, JOBFENCE_TOKEN_FILE.
  credentials: credentialsFromEnv(),
  workerId: 'node-typed-1',
  queue: 'refunds',
  leaseSeconds: 30,
  timeoutSeconds: 10,
  retry: new RetryPolicy({ budget: 30, initial: 0.1, maximum: 2 }),
});

async function handle(job: ClaimedJob): Promise<void> {
  const key: string = job.operationKey;
  const fair: string = `${job.fairnessKey}@${job.priority}`;
  console.log(fair);
  if (job.nextAction === 'RECONCILE') {
    const seen = await job.recordObservation('SUCCEEDED', `re_${job.jobId}`, '{}',
      observationDedupKey(client.workerId, `re_${job.jobId}`));
    if (seen.duplicate) return;
  }
  try {
    const written: Written = await job.complete(`re_${key}`, '{"status":"succeeded"}');
    console.log(written.replayed, written.job.state, job.attempt);
  } catch (err) {
    if (err instanceof AttemptSuperseded) {
      console.log('superseded by', err.currentAttempt, err.observationRecorded);
    } else if (err instanceof JobNotRunning) {
      console.log('no longer running:', err.state);
    } else if (err instanceof Unavailable || err instanceof OutcomeUnknown) {
      const failed: FailWritten = await job.fail(Disposition.RETRY_RECONCILE, 'provider timeout', 5,
        { providerRetryAfterSeconds: 30 });
      console.log(failed.applied, failed.overrideReason);
    } else if (err instanceof ApiVersionUnsupported) {
      console.log(`coordinator speaks ${err.coordinator}, this client ${API_MAJOR}.x (${API_VERSION_HEADER})`);
    } else {
      throw err;
    }
  }
  await job.renewLease(60);
}

async function main(): Promise<void> {
  const stop = new AbortController();
  process.on('SIGINT', () => stop.abort());
  const { job, observations } = await client.getJob(1);
  console.log(job.attempt, observations.length, Object.keys(REASONS).length);
  // A merchant's refund, ahead of the default priority (5).
  const added = await client.enqueue('refunds', 'refund-pay_1-500-TWD', '{}',
    { fairnessKey: 'merchant-7', priority: 7, delaySeconds: 0 });
  console.log(added.created, added.job.priority, added.job.fairnessKey);
  const items: EnqueueItem[] = [{ queue: 'refunds', operationKey: 'refund-2', payload: '{}', fairnessKey: 'merchant-8' }];
  console.log((await client.enqueueBatch(items)).length);
  const claimed: ClaimedJob[] = await client.claim(4, { waitSeconds: 10, signal: stop.signal });
  await Promise.all(claimed.map(handle));
  await client.run(handle, {
    concurrency: 4,
    signal: stop.signal,
    onClaimError: (err: Error) => {
      if (err instanceof NotAuthorized) stop.abort();
    },
  });
  // The names the four clients share: Handler, RunOptions, Denied.
  const handler: Handler = handle;
  const options: RunOptions = { concurrency: 2, waitSeconds: 5, signal: stop.signal };
  await client.run(handler, options).catch((err: unknown) => {
    if (!(err instanceof Denied)) throw err;
  });
  client.close();
}

void main;
