'use strict';
// The conformance agent of the Node client (see README.md beside it).

const readline = require('node:readline');
const jw = require('../../sdk/node');

const KINDS = [
  [jw.AttemptSuperseded, 'superseded'], [jw.JobNotRunning, 'not_running'], [jw.JobNotFound, 'not_found'],
  [jw.JobFinished, 'finished'], [jw.LeaseNotExpired, 'lease_not_expired'], [jw.InvalidRequest, 'invalid'],
  [jw.OutcomeUnknown, 'outcome_unknown'], [jw.Unavailable, 'unavailable'], [jw.NotAuthorized, 'denied'],
  [jw.ApiVersionUnsupported, 'api_version'],
];

function error(err) {
  if (!(err instanceof jw.JobfenceError)) throw err;
  const kind = (KINDS.find(([cls]) => err instanceof cls) || [null, 'other'])[1];
  return `error ${kind} recorded=${err.observationRecorded ? 1 : 0} current_attempt=${err.currentAttempt || 0}`;
}

async function main() {
  const [target, workerId, queue] = process.argv.slice(2);
  // TLS and a token when the driver gives them (JOBFENCE_TLS_CA, ...).
  const client = new jw.WorkerClient({
    target, workerId, queue, leaseSeconds: 30, credentials: jw.credentialsFromEnv(),
  });
  const handles = [];
  const claimed = (job) => {
    handles.push(job);
    return `claimed ${handles.length - 1} ${job.jobId} ${job.attempt} ${job.nextAction.toLowerCase()} `
      + `${job.takeover ? 1 : 0} ${job.observations.length}`;
  };
  const commands = {
    reasons: async () => `reasons ${Object.keys(jw.REASONS).sort().join(' ')}`,
    held: async () => `held ${handles.length}`,
    retries: async () => `retries ${client.retries}`,
    get: async (id) => {
      const { job } = await client.getJob(Number(id));
      return `job ${job.state.replace('JOB_STATE_', '').toLowerCase()} ${job.attempt}`;
    },
    enqueue: async (key, fairnessKey, priority) => {
      const options = { priority: Number(priority) };
      if (fairnessKey !== '-') options.fairnessKey = fairnessKey;
      const { job, created } = await client.enqueue(queue, key, '{}', options);
      return `enqueued ${job.jobId} created=${created ? 1 : 0} priority=${job.priority} fairness_key=${job.fairnessKey}`;
    },
    fair: async (i) => {
      const job = handles[Number(i)];
      return `fair priority=${job.priority} fairness_key=${job.fairnessKey}`;
    },
    claim: async () => {
      const jobs = await client.claim(1);
      return jobs.length ? claimed(jobs[0]) : 'empty';
    },
    takeover: async (id) => claimed(await client.takeover(Number(id))),
    // The runner with a handler that must not run: only sent when its
    // claims are refused, so run() rejects.
    run: async () => {
      await client.run(async (job) => { throw new Error(`a refused runner got job ${job.jobId}`); });
      return 'run ended';
    },
    complete: async (i, ref) => {
      const written = await handles[Number(i)].complete(ref, JSON.stringify({ id: ref }));
      return `ok replayed=${written.replayed ? 1 : 0}`;
    },
    'complete-next': async (i, ref) => {
      const job = handles[Number(i)];
      job.askForNextJob();
      const write = await job.complete(ref, JSON.stringify({ id: ref }))
        .then((w) => `ok replayed=${w.replayed ? 1 : 0}`, error);
      const next = job.takeNextJob();
      return `${write} next ${next ? claimed(next) : 'empty'}`;
    },
    fail: async (i, disposition) => {
      const out = await handles[Number(i)].fail(jw.Disposition[disposition.toUpperCase()], 'conformance');
      return `ok applied=${out.applied.replace('FAIL_DISPOSITION_', '').toLowerCase()} replayed=${out.replayed ? 1 : 0}`;
    },
  };
  for await (const line of readline.createInterface({ input: process.stdin })) {
    const [cmd, ...args] = line.split(/\s+/).filter(Boolean);
    if (!cmd) continue;
    if (cmd === 'quit') break;
    const run = commands[cmd] || (async () => `unknown command ${cmd}`);
    const reply = await run(...args).catch(error);
    process.stdout.write(reply + '\n');
  }
  client.close();
  process.exit(0);
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
