'use strict';
// Errors a worker can catch, read from the google.rpc.ErrorInfo (domain
// "jobfence") that the coordinator attaches to every expected refusal. One
// class per reason (REASONS, built from the enum ErrorReason of
// errors.proto); switch on the class, never on the message.
//
// Three families a worker acts on: refusals (AttemptSuperseded, ...), where
// repeating the call cannot change the answer; OutcomeUnknown (a lost commit
// or a transport failure), where the call may have been applied (after a
// Claim or Takeover: hold nothing); Unavailable (DatabaseUnavailable,
// TransactionConflict, Overloaded), where nothing was applied: retry later;
// Denied, also named NotAuthorized (Unauthenticated: CredentialMissing, CredentialInvalid,
// CredentialExpired; PermissionDenied: RoleNotAllowed, QueueNotAllowed,
// OperatorMismatch), where the caller may not make the call: nothing was
// applied, never retried.

const { status: Code } = require('@grpc/grpc-js');
const protobuf = require('protobufjs');
const { errorReasons } = require('./proto');

const DOMAIN = 'jobfence';

// google.rpc.Status and the details jobfence sends, decoded by hand so the
// package needs no googleapis protos.
const rpc = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        protobuf: {
          nested: {
            Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } },
            Duration: { fields: { seconds: { type: 'int64', id: 1 }, nanos: { type: 'int32', id: 2 } } },
          },
        },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
            ErrorInfo: {
              fields: {
                reason: { type: 'string', id: 1 },
                domain: { type: 'string', id: 2 },
                metadata: { keyType: 'string', type: 'string', id: 3 },
              },
            },
            BadRequest: {
              fields: { field_violations: { rule: 'repeated', type: 'FieldViolation', id: 1 } },
              nested: {
                FieldViolation: {
                  fields: { field: { type: 'string', id: 1 }, description: { type: 'string', id: 2 } },
                },
              },
            },
            RetryInfo: { fields: { retry_delay: { type: 'google.protobuf.Duration', id: 1 } } },
          },
        },
      },
    },
  },
});
const Status = rpc.lookupType('google.rpc.Status');
const ErrorInfo = rpc.lookupType('google.rpc.ErrorInfo');
const BadRequest = rpc.lookupType('google.rpc.BadRequest');
const RetryInfo = rpc.lookupType('google.rpc.RetryInfo');

function stateName(domainState) {
  return domainState ? 'JOB_STATE_' + domainState.toUpperCase() : 'JOB_STATE_UNSPECIFIED';
}

class JobfenceError extends Error {
  /** code: the gRPC status code; reason: the ErrorInfo reason ('' if none). */
  constructor(code, message, reason = '', metadata = {}) {
    super(`${reason || code}: ${message}`);
    this.name = this.constructor.name;
    this.code = code;
    this.details = message;
    this.reason = reason;
    this.metadata = { ...metadata };
  }

  metaInt(key) {
    const n = Number.parseInt(this.metadata[key] ?? '0', 10);
    return Number.isNaN(n) ? 0 : n;
  }
}

class AttemptSuperseded extends JobfenceError {
  constructor(...args) {
    super(...args);
    this.currentAttempt = this.metaInt('current_attempt');
    this.currentState = stateName(this.metadata.current_state);
    this.observationRecorded = false;
  }
}
class AttemptNotIssued extends JobfenceError {
  constructor(...args) {
    super(...args);
    this.currentAttempt = this.metaInt('current_attempt');
  }
}
class JobNotRunning extends JobfenceError {
  constructor(...args) {
    super(...args);
    this.state = stateName(this.metadata.current_state);
    this.observationRecorded = false;
  }
}
class JobNotFound extends JobfenceError {}
/** JOB_PRUNED (NOT_FOUND): the job finished and retention pruned it; metadata holds its key record. */
class JobPruned extends JobNotFound {}
/** EVENTS_CURSOR_PRUNED (OUT_OF_RANGE): a feed cursor behind what retention pruned. */
class EventsCursorPruned extends JobfenceError {}
class JobFinished extends JobfenceError {
  constructor(...args) {
    super(...args);
    this.state = stateName(this.metadata.current_state);
  }
}
class LeaseNotExpired extends JobfenceError {
  constructor(...args) {
    super(...args);
    this.currentAttempt = this.metaInt('current_attempt');
  }
}
class OperationKeyConflict extends JobfenceError {
  constructor(...args) {
    super(...args);
    this.jobId = this.metaInt('job_id');
  }
}
class JobNotInManualReview extends JobfenceError {}
class JobNotCancellable extends JobfenceError {}
/** SETTLEMENT_EXCEPTION_NOT_FOUND (NOT_FOUND, operators): metadata.exception_id. */
class SettlementExceptionNotFound extends JobfenceError {}
/** SETTLEMENT_EXCEPTION_MOVED (FAILED_PRECONDITION, operators): someone acted first; metadata seen_state, current_state. */
class SettlementExceptionMoved extends JobfenceError {}
class InvalidRequest extends JobfenceError {
  constructor(code, message, reason, metadata, violations = []) {
    super(code, message, reason, metadata);
    this.violations = violations;
  }
}
class OutcomeUnknown extends JobfenceError {}
class CommitOutcomeUnknown extends OutcomeUnknown {}
class Unavailable extends JobfenceError {}
class DatabaseUnavailable extends Unavailable {}
class TransactionConflict extends Unavailable {}
class Overloaded extends Unavailable {
  constructor(code, message, reason, metadata, retryAfterSeconds = null) {
    super(code, message, reason, metadata);
    this.retryAfterSeconds = retryAfterSeconds;
  }
}
/** The load balancer found no coordinator serving and forwarded nothing. */
class NoCoordinatorServing extends Unavailable {}
/**
 * A Takeover the budget of the job's provider cannot pay for now (docs/design.md
 * rule 11): nothing taken; ask again after retryAfterSeconds.
 */
class ProviderHeld extends JobfenceError {
  constructor(code, message, reason, metadata, retryAfterSeconds = null) {
    super(code, message, reason, metadata);
    this.retryAfterSeconds = retryAfterSeconds;
    this.provider = (metadata && metadata.provider) || '';
  }
}
/** PROVIDER_BUDGET_EXHAUSTED: no units left now (metadata.limit: rate or in_flight). */
class ProviderBudgetExhausted extends ProviderHeld {}
/** PROVIDER_PAUSED: an operator paused the provider. */
class ProviderPaused extends ProviderHeld {}
/** PROVIDER_THROTTLED: a worker reported the provider's 429; its Retry-After runs. */
class ProviderThrottled extends ProviderHeld {}
class InternalError extends JobfenceError {}
class ServerShuttingDown extends JobfenceError {}
/** Refused for who the caller is: nothing applied, never retried; fix the credential. */
class NotAuthorized extends JobfenceError {}
// The name every jobfence client gives this family (Rust Denied, Go
// ErrDenied, Python Denied): the same class as NotAuthorized, which stays.
const Denied = NotAuthorized;
class Unauthenticated extends NotAuthorized {}
class CredentialMissing extends Unauthenticated {}
class CredentialInvalid extends Unauthenticated {}
class CredentialExpired extends Unauthenticated {}
class PermissionDenied extends NotAuthorized {}
class RoleNotAllowed extends PermissionDenied {}
class QueueNotAllowed extends PermissionDenied {
  constructor(...args) {
    super(...args);
    this.queue = this.metadata.queue || '';
    this.jobId = this.metaInt('job_id');
  }
}
class OperatorMismatch extends PermissionDenied {}

// Every class of a reason, by name: a reason's class is named after it
// (JOB_NOT_FOUND -> JobNotFound), except those in RENAMED.
const CLASSES = {
  InvalidRequest, JobNotFound, AttemptSuperseded, AttemptNotIssued, JobNotRunning, JobFinished,
  LeaseNotExpired, OperationKeyConflict, JobNotInManualReview, JobNotCancellable, CommitOutcomeUnknown,
  DatabaseUnavailable, TransactionConflict, InternalError, Overloaded, ServerShuttingDown,
  NoCoordinatorServing, CredentialMissing, CredentialInvalid, CredentialExpired, RoleNotAllowed,
  QueueNotAllowed, OperatorMismatch, ProviderBudgetExhausted, ProviderPaused, ProviderThrottled,
  JobPruned, EventsCursorPruned, SettlementExceptionNotFound, SettlementExceptionMoved,
};
const RENAMED = { INTERNAL: 'InternalError' };

function classOf(reason) {
  const name = RENAMED[reason]
    || reason.split('_').map((w) => w[0] + w.slice(1).toLowerCase()).join('');
  const Cls = CLASSES[name];
  if (!Cls) throw new Error(`errors.proto has the reason ${reason}, and errors.js no class ${name} for it`);
  return Cls;
}

/** Every ErrorInfo reason the coordinator sends (errors.proto), and its class. */
const REASONS = Object.freeze(Object.fromEntries(errorReasons().map((r) => [r, classOf(r)])));

// Codes that, without a jobfence ErrorInfo, come from the transport
// (connection refused or cut, an expired deadline, a proxy): nobody can say
// whether the call reached the coordinator.
const TRANSPORT_CODES = new Set([
  Code.UNAVAILABLE, Code.ABORTED, Code.DEADLINE_EXCEEDED, Code.CANCELLED, Code.UNKNOWN, Code.INTERNAL,
]);

/** Maps a status (code, message, encoded google.rpc.Status or null) to an error. */
function fromStatus(code, message, statusBytes) {
  let info = null;
  let violations = [];
  let retryAfter = null;
  if (statusBytes) {
    const status = Status.decode(statusBytes);
    for (const any of status.details) {
      const type = any.type_url.slice(any.type_url.lastIndexOf('/') + 1);
      if (type === 'google.rpc.ErrorInfo') {
        const candidate = ErrorInfo.decode(any.value);
        if (candidate.domain === DOMAIN) info = candidate;
      } else if (type === 'google.rpc.BadRequest') {
        violations = BadRequest.decode(any.value).field_violations.map((v) => [v.field, v.description]);
      } else if (type === 'google.rpc.RetryInfo') {
        const d = RetryInfo.decode(any.value).retry_delay;
        if (d) retryAfter = Number(d.seconds || 0) + (d.nanos || 0) / 1e9;
      }
    }
  }
  if (!info) {
    return TRANSPORT_CODES.has(code) ? new OutcomeUnknown(code, message) : new JobfenceError(code, message);
  }
  const Cls = REASONS[info.reason] || JobfenceError;
  const metadata = info.metadata || {};
  if (Cls === InvalidRequest) return new InvalidRequest(code, message, info.reason, metadata, violations);
  if (Cls === Overloaded || Cls.prototype instanceof ProviderHeld) {
    return new Cls(code, message, info.reason, metadata, retryAfter);
  }
  return new Cls(code, message, info.reason, metadata);
}

/**
 * A write's refusal carried in the answer of a Complete or Fail that asked
 * for the next job (NextJobs.writeRefused), as the error the same call
 * without the request rejects with (docs/design.md rule 16).
 */
function fromRefusal(refusal) {
  const Cls = REASONS[refusal.reason] || JobfenceError;
  const { code, message, reason } = refusal;
  const metadata = refusal.metadata || {};
  if (Cls === InvalidRequest) return new InvalidRequest(code, message, reason, metadata, []);
  if (Cls === Overloaded || Cls.prototype instanceof ProviderHeld) {
    return new Cls(code, message, reason, metadata, null);
  }
  return new Cls(code, message, reason, metadata);
}

/** Maps a failed grpc-js call to a JobfenceError. */
function fromServiceError(err) {
  const raw = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  return fromStatus(err.code, err.details || err.message || '', raw.length ? raw[0] : null);
}

/** A fenced write, an observation or a read may be sent again (a replay is recognised). */
function retryableWrite(err) {
  return err instanceof OutcomeUnknown || err instanceof Unavailable;
}

/**
 * An UNAVAILABLE that grpc-js made up because no connection could be made (a
 * coordinator restarting, nothing listening: the request never left), or
 * because the server refused the stream (HTTP/2 REFUSED_STREAM: not processed).
 */
function neverSent(err) {
  if (!(err instanceof JobfenceError) || err.reason || err.code !== 14) return false;
  return /ECONNREFUSED|No connection established|Failed to connect|REFUSED_STREAM/i.test(err.message);
}

/** A Claim or Takeover is sent again only when nothing was applied (or nothing was sent). */
function retryableClaim(err) {
  return err instanceof Unavailable || neverSent(err);
}

/** The major version of the jobfence API this client speaks (jobfence.v1). */
const API_MAJOR = 1;
/** The response header a coordinator names its API version in. */
const API_VERSION_HEADER = 'jobfence-api-version';

/**
 * The coordinator speaks another major version of the API (its
 * `jobfence-api-version` header): its answer was not read. Never retried;
 * the call itself may have been applied by it. A coordinator without the
 * header is older than it and spoke API 1: accepted.
 */
class ApiVersionUnsupported extends JobfenceError {
  constructor(coordinator) {
    super(9, `the coordinator speaks API ${coordinator}, this client speaks ${API_MAJOR}.x`,
      'API_VERSION_UNSUPPORTED');
    this.coordinator = coordinator;
  }
}

/** An ApiVersionUnsupported for the first grpc.Metadata that names another major version, or null. */
function apiVersionRefusal(...metadata) {
  for (const md of metadata) {
    if (!md || typeof md.get !== 'function') continue;
    for (const value of md.get(API_VERSION_HEADER)) {
      const named = String(value).trim();
      const major = named.split('.')[0];
      if (!/^[0-9]+$/.test(major) || Number(major) !== API_MAJOR) return new ApiVersionUnsupported(named);
    }
  }
  return null;
}

module.exports = {
  API_MAJOR, API_VERSION_HEADER, ApiVersionUnsupported, apiVersionRefusal,
  DOMAIN, REASONS, JobfenceError, AttemptSuperseded, AttemptNotIssued, JobNotRunning, JobNotFound,
  JobPruned, EventsCursorPruned, SettlementExceptionNotFound, SettlementExceptionMoved,
  JobFinished, LeaseNotExpired, OperationKeyConflict, JobNotInManualReview, JobNotCancellable,
  InvalidRequest, OutcomeUnknown, CommitOutcomeUnknown, Unavailable, DatabaseUnavailable,
  TransactionConflict, Overloaded, NoCoordinatorServing, InternalError, ServerShuttingDown, NotAuthorized,
  Denied, Unauthenticated, CredentialMissing, CredentialInvalid, CredentialExpired, PermissionDenied, RoleNotAllowed,
  QueueNotAllowed, OperatorMismatch, ProviderHeld, ProviderBudgetExhausted, ProviderPaused, ProviderThrottled,
  fromStatus, fromServiceError, fromRefusal,
  retryableWrite, retryableClaim, neverSent, encodeStatusForTests: (obj) => Status.encode(Status.fromObject(obj)).finish(),
  encodeDetailForTests: (type, obj) => ({
    type_url: 'type.googleapis.com/google.rpc.' + type,
    value: rpc.lookupType('google.rpc.' + type).encode(rpc.lookupType('google.rpc.' + type).fromObject(obj)).finish(),
  }),
};
