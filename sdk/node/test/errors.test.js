'use strict';
// Every ErrorInfo reason the coordinator sends maps to its own class, in the
// family a worker acts on (refusal, outcome unknown, retry).

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const protobuf = require('protobufjs');
const { status: Code } = require('@grpc/grpc-js');
const jw = require('..');
const { fromStatus, retryableWrite, retryableClaim, encodeStatusForTests, encodeDetailForTests } = jw.errors;

function serverReasons() {
  // The API's errors.proto: this checkout's, or JOBFENCE_REPO's for a copy of
  // the package. Parsed with protobufjs on its own, not through the
  // package's loader.
  const repo = process.env.JOBFENCE_REPO || path.join(__dirname, '..', '..', '..');
  const file = path.join(repo, 'proto', 'jobfence', 'v1', 'errors.proto');
  const parsed = protobuf.parse(fs.readFileSync(file, 'utf8')).root.lookupEnum('jobfence.v1.ErrorReason');
  return Object.entries(parsed.values).filter(([, n]) => n !== 0).map(([name]) => name);
}

function status(code, reason, metadata = {}, ...extra) {
  const details = [encodeDetailForTests('ErrorInfo', { reason, domain: 'jobfence', metadata }), ...extra];
  return encodeStatusForTests({ code, message: 'refused', details });
}

test('every reason of the coordinator has its own class', () => {
  assert.deepStrictEqual(Object.keys(jw.REASONS).sort(), serverReasons().sort());
  assert.strictEqual(new Set(Object.values(jw.REASONS)).size, Object.keys(jw.REASONS).length);
  for (const [reason, Cls] of Object.entries(jw.REASONS)) {
    const err = fromStatus(Code.FAILED_PRECONDITION, 'x', status(Code.FAILED_PRECONDITION, reason));
    assert.strictEqual(err.constructor, Cls, reason);
    assert.strictEqual(err.reason, reason);
  }
});

test('superseded carries the current attempt and state', () => {
  const err = fromStatus(Code.FAILED_PRECONDITION, 'x', status(Code.FAILED_PRECONDITION, 'ATTEMPT_SUPERSEDED',
    { current_attempt: '8', current_state: 'succeeded' }));
  assert.ok(err instanceof jw.AttemptSuperseded);
  assert.strictEqual(err.currentAttempt, 8);
  assert.strictEqual(err.currentState, 'JOB_STATE_SUCCEEDED');
  assert.ok(!retryableWrite(err));
});

test('overloaded applied nothing and is retried after its delay', () => {
  const retry = encodeDetailForTests('RetryInfo', { retry_delay: { seconds: 0, nanos: 100000000 } });
  const err = fromStatus(Code.RESOURCE_EXHAUSTED, 'busy', status(Code.RESOURCE_EXHAUSTED, 'OVERLOADED', {}, retry));
  assert.ok(err instanceof jw.Overloaded && err instanceof jw.Unavailable);
  assert.strictEqual(err.retryAfterSeconds, 0.1);
  assert.ok(retryableClaim(err) && retryableWrite(err));
  // The retry waits at least the server's hint, however short the backoff.
  const short = new jw.RetryPolicy({ initial: 0.001, maximum: 0.001 });
  assert.ok(short.wait(1, err) >= 0.1);
  assert.ok(short.wait(1, new jw.Unavailable(Code.UNAVAILABLE, 'x')) <= 0.001);
});

test('a connection never made applied nothing, and a claim retries it', () => {
  const refused = fromStatus(Code.UNAVAILABLE,
    'No connection established. Last error: Error: connect ECONNREFUSED 127.0.0.1:1.', null);
  assert.ok(refused instanceof jw.OutcomeUnknown);
  assert.ok(retryableClaim(refused) && retryableWrite(refused));
  // A connection cut after the request left: nobody knows.
  const cut = fromStatus(Code.UNAVAILABLE, 'Connection dropped', null);
  assert.ok(!retryableClaim(cut) && retryableWrite(cut));
});

test('the retry budget is time, not tries', () => {
  const policy = new jw.RetryPolicy();
  assert.deepStrictEqual([policy.budget, policy.initial, policy.maximum], [30, 0.05, 2]);
  const down = new jw.Unavailable(Code.UNAVAILABLE, 'x');
  // The 20th retry still fits (a 10 s outage takes about 12), and none
  // starts whose wait would end past the budget.
  assert.notStrictEqual(policy.nextWait(20, down, 10), null);
  assert.strictEqual(policy.nextWait(1, down, 29.99), null);
  assert.strictEqual(new jw.RetryPolicy({ budget: 0 }).nextWait(1, down, 0), null);
});

test("the load balancer's answer applied nothing", () => {
  const err = fromStatus(Code.UNAVAILABLE, 'no jobfence coordinator is serving',
    status(Code.UNAVAILABLE, 'NO_COORDINATOR_SERVING', {}));
  assert.ok(err instanceof jw.NoCoordinatorServing && err instanceof jw.Unavailable);
  assert.ok(retryableClaim(err) && retryableWrite(err));
});

test('a lost commit is unknown and never retried as a claim; a transport failure is unknown', () => {
  const lost = fromStatus(Code.UNAVAILABLE, 'x', status(Code.UNAVAILABLE, 'COMMIT_OUTCOME_UNKNOWN'));
  assert.ok(lost instanceof jw.OutcomeUnknown);
  assert.ok(!retryableClaim(lost) && retryableWrite(lost));
  assert.ok(fromStatus(Code.UNAVAILABLE, 'tcp', null) instanceof jw.OutcomeUnknown);
  const foreign = encodeStatusForTests({ code: 9, message: 'x', details: [encodeDetailForTests('ErrorInfo', { reason: 'ATTEMPT_SUPERSEDED', domain: 'proxy.example' })] });
  assert.strictEqual(fromStatus(Code.FAILED_PRECONDITION, 'x', foreign).constructor, jw.JobfenceError);
});

test('invalid requests keep their field violations', () => {
  const bad = encodeDetailForTests('BadRequest', { field_violations: [{ field: 'lease', description: 'too long' }] });
  const err = fromStatus(Code.INVALID_ARGUMENT, 'x', status(Code.INVALID_ARGUMENT, 'INVALID_REQUEST', {}, bad));
  assert.deepStrictEqual(err.violations, [['lease', 'too long']]);
});

test('the dedup key is the one every SDK derives', () => {
  assert.strictEqual(jw.observationDedupKey('w1', 're_1'), 'worker:w1:re_1');
  const key = jw.observationDedupKey('w1', 'r'.repeat(255));
  assert.match(key, /^worker-sha256:[0-9a-f]{64}$/);
});

test('a denial applied nothing and is never retried', () => {
  for (const [reason, code, Family] of [
    ['CREDENTIAL_MISSING', Code.UNAUTHENTICATED, jw.Unauthenticated],
    ['CREDENTIAL_INVALID', Code.UNAUTHENTICATED, jw.Unauthenticated],
    ['CREDENTIAL_EXPIRED', Code.UNAUTHENTICATED, jw.Unauthenticated],
    ['ROLE_NOT_ALLOWED', Code.PERMISSION_DENIED, jw.PermissionDenied],
    ['QUEUE_NOT_ALLOWED', Code.PERMISSION_DENIED, jw.PermissionDenied],
    ['OPERATOR_MISMATCH', Code.PERMISSION_DENIED, jw.PermissionDenied],
  ]) {
    const err = fromStatus(code, 'no', status(code, reason, { queue: 'payouts', job_id: '7' }));
    assert.ok(err instanceof Family && err instanceof jw.NotAuthorized, reason);
    assert.ok(!retryableClaim(err) && !retryableWrite(err), reason);
  }
  const q = fromStatus(Code.PERMISSION_DENIED, 'no', status(Code.PERMISSION_DENIED, 'QUEUE_NOT_ALLOWED', { queue: 'payouts', job_id: '7' }));
  assert.deepStrictEqual([q.queue, q.jobId], ['payouts', 7]);
});

test('credentials come from the environment, the token from its file', () => {
  const fs = require('node:fs');
  const os = require('node:os');
  const path = require('node:path');
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'jf-')), 'token');
  fs.writeFileSync(file, 'jft_secret\n');
  assert.deepStrictEqual(jw.credentialsFromEnv({ JOBFENCE_TOKEN_FILE: file }), { token: 'jft_secret' });
  assert.deepStrictEqual(jw.credentialsFromEnv({}), {});
  assert.throws(() => jw.credentialsFromEnv({ JOBFENCE_TLS_CLIENT_CERT: file }), /JOBFENCE_TLS_CLIENT_KEY/);
});

test('Denied is NotAuthorized under the name every client shares', () => {
  assert.strictEqual(jw.Denied, jw.NotAuthorized);
  const err = fromStatus(Code.UNAUTHENTICATED, 'no', status(Code.UNAUTHENTICATED, 'CREDENTIAL_MISSING'));
  assert.ok(err instanceof jw.Denied);
});
