// Type declarations of jobfence-worker (Node).

/** A job as the coordinator returns it (proto jobfence.v1.Job, camelCase). */
export interface Job {
  jobId: number;
  queue: string;
  operationKey: string;
  payload: string;
  state: string;
  attempt: number;
  nextAction: 'NEXT_ACTION_EXECUTE' | 'NEXT_ACTION_RECONCILE' | 'NEXT_ACTION_UNSPECIFIED';
  leaseOwner: string;
  dispatchCount: number;
  providerReference: string;
  result: string;
  lastError: string;
  stateReason: string;
  /** 1 (lowest) to 9 (most urgent); docs/design.md rule 18. */
  priority: number;
  /** Among whose jobs claims go round-robin (a merchant, a tenant); '' when the job was given none. */
  fairnessKey: string;
  [field: string]: unknown;
}

/** The options of `enqueue`, and of each item of `enqueueBatch`. */
export interface EnqueueOptions {
  /** Due this many seconds from now instead of at once. */
  delaySeconds?: number;
  /** A merchant, a tenant (at most 128 bytes, not blank): within a queue and a priority, claims go round-robin across the keys (docs/design.md rule 18). */
  fairnessKey?: string;
  /** 1 (lowest) to 9 (most urgent); unset or 0: the default, 5. */
  priority?: number;
}

/** One job of `enqueueBatch`. */
export interface EnqueueItem extends EnqueueOptions {
  queue: string;
  operationKey: string;
  payload: string;
}

/** Evidence about a job (proto jobfence.v1.Observation). */
export interface Observation {
  observationId: number;
  jobId: number;
  attempt: number;
  source: string;
  outcome: string;
  providerReference: string;
  body: string;
  dedupKey: string;
  [field: string]: unknown;
}

export type DispositionValue =
  | 'FAIL_DISPOSITION_RETRY_RECONCILE'
  | 'FAIL_DISPOSITION_RETRY_EXECUTE'
  | 'FAIL_DISPOSITION_FAILED'
  | 'FAIL_DISPOSITION_MANUAL_REVIEW';

/** How Fail disposes of the job. */
export declare const Disposition: Readonly<{
  RETRY_RECONCILE: 'FAIL_DISPOSITION_RETRY_RECONCILE';
  RETRY_EXECUTE: 'FAIL_DISPOSITION_RETRY_EXECUTE';
  FAILED: 'FAIL_DISPOSITION_FAILED';
  MANUAL_REVIEW: 'FAIL_DISPOSITION_MANUAL_REVIEW';
}>;

export type ObservationOutcome = 'SUCCEEDED' | 'PENDING' | 'FAILED' | 'NOT_FOUND' | 'UNKNOWN';

export declare class RetryPolicy {
  constructor(options?: { budget?: number; initial?: number; maximum?: number });
  /** Seconds of retrying one call, from its first try (default 30; 0: no retry). */
  budget: number;
  /** Seconds. */
  initial: number;
  /** Seconds. */
  maximum: number;
  /** Seconds to wait before retry number `retry` (1 for the first). */
  backoff(retry: number): number;
  /** Seconds before retry `retry` after `err`: the backoff, or the server's retry-after hint when longer. */
  wait(retry: number, err: unknown): number;
  /** `wait(retry, err)`, or null when it would end past the budget (`elapsed`: seconds since the first try). */
  nextWait(retry: number, err: unknown, elapsed: number): number | null;
}

/**
 * TLS settings and a bearer token (all absent for a coordinator run with
 * --insecure). The token travels as `authorization: Bearer ...` metadata.
 */
export interface Credentials {
  /** The CA certificate (PEM) that signed the coordinator's: TLS. */
  tlsCaPem?: Buffer;
  /** A client certificate and its key (PEM), for mutual TLS. */
  tlsClientCertPem?: Buffer;
  tlsClientKeyPem?: Buffer;
  token?: string;
}

/** Reads JOBFENCE_TLS_CA, JOBFENCE_TLS_CLIENT_CERT/_KEY and JOBFENCE_TOKEN_FILE (or JOBFENCE_TOKEN). */
export declare function credentialsFromEnv(): Credentials;

export interface WorkerClientOptions {
  /** `host:port` of the coordinator. */
  target: string;
  /** TLS and bearer token (`credentialsFromEnv()`); none by default. */
  credentials?: Credentials;
  workerId: string;
  queue: string;
  /** Lease asked for on every Claim/Takeover, in seconds (default 30). */
  leaseSeconds?: number;
  /** Deadline of one RPC, in seconds (default 10). */
  timeoutSeconds?: number;
  retry?: RetryPolicy | { budget?: number; initial?: number; maximum?: number };
}

export interface Written { replayed: boolean; job: Job }
export interface FailOptions {
  /** The provider's Retry-After, seconds; sent as FailRequest.provider_retry_after. Unset: not sent. */
  providerRetryAfterSeconds?: number;
}
export interface FailWritten extends Written { applied: DispositionValue; overrideReason: string }
export interface Recorded { observation: Observation; duplicate: boolean }

export declare class WorkerClient {
  constructor(options: WorkerClientOptions);
  readonly workerId: string;
  readonly queue: string;
  /** Calls sent again because the answer said nothing was applied (or, for a write, that its outcome was unknown). */
  retries: number;
  close(): void;
  /** Up to maxJobs handles (maybe none); OutcomeUnknown means hold nothing. */
  claim(maxJobs?: number, options?: { waitSeconds?: number; signal?: AbortSignal }): Promise<ClaimedJob[]>;
  /** One job whose lease expired; it starts with RECONCILE. */
  takeover(jobId: number): Promise<ClaimedJob>;
  getJob(jobId: number): Promise<{ job: Job; observations: Observation[] }>;
  /** Adds a job, idempotent on (queue, operationKey); the job returned carries its priority and fairness key. */
  enqueue(queue: string, operationKey: string, payload: string, options?: EnqueueOptions): Promise<{ job: Job; created: boolean }>;
  /** Adds the items in one transaction; one result per item, in order. */
  enqueueBatch(items: EnqueueItem[]): Promise<unknown[]>;
  /** Claims and handles jobs until `signal` aborts; a claim that failed after the retries goes to `onClaimError` (default: a line on stderr), then it claims again. Rejects with the error when a claim is refused for who the caller is (Denied) or as an InvalidRequest: asking again cannot succeed. */
  run(handler: Handler, options?: RunOptions): Promise<void>;
}

/** The work `run` does with each job it holds: write back through the job; one left unsettled is released with RETRY_RECONCILE. */
export type Handler = (job: ClaimedJob) => Promise<void>;

/** The options of `run` (Go `RunOptions`). */
export interface RunOptions {
  /** Jobs handled at once (default 1); `run` claims only for free slots. */
  concurrency?: number;
  /** The long poll of each Claim, in seconds (default 10). */
  waitSeconds?: number;
  /** Aborting it stops the claiming; the handlers in flight finish. */
  signal?: AbortSignal;
  /** Hears a claim that failed after the retries (default: a line on stderr). */
  onClaimError?: (err: Error) => void;
}

/** A job this worker holds; every write presents its attempt. */
export declare class ClaimedJob {
  readonly job: Job;
  readonly jobId: number;
  /** THE idempotency key to send to the provider. */
  readonly operationKey: string;
  /** The fencing token; for logs only. */
  readonly attempt: number;
  readonly payload: string;
  /** 1 (lowest) to 9 (most urgent). */
  readonly priority: number;
  /** The fairness key the job was enqueued with; '' when none. */
  readonly fairnessKey: string;
  readonly nextAction: 'EXECUTE' | 'RECONCILE';
  readonly takeover: boolean;
  readonly observations: Observation[];
  /** True once a write told this handle it no longer holds the job. */
  readonly settled: boolean;
  /**
   * Makes complete and fail also claim the worker's next job of its queue
   * in the same call and transaction (docs/design.md rule 16); run() does
   * it for every job. A stale write still brings its next job; a write
   * whose outcome is unknown brings none.
   */
  askForNextJob(): void;
  /** The next job a write-back of this handle brought, or null. */
  takeNextJob(): ClaimedJob | null;
  complete(providerReference: string, result?: string): Promise<Written>;
  /**
   * Reports a failure. Set `providerRetryAfterSeconds` when the provider
   * pushed back (HTTP 429, or 503 with Retry-After) to how long it asked to
   * wait (positive, at most 24 h): the coordinator then hands out nothing
   * for the provider until then, on every coordinator.
   */
  fail(disposition: DispositionValue, error: string, retryDelaySeconds?: number, options?: FailOptions): Promise<FailWritten>;
  renewLease(leaseSeconds: number): Promise<Written>;
  recordObservation(outcome: ObservationOutcome, providerReference: string, body: string, dedupKey: string): Promise<Recorded>;
}

export declare function observationDedupKey(workerId: string, providerReference: string): string;

export declare class JobfenceError extends Error {
  /** The gRPC status code. */
  code: number;
  /** The status message. */
  details: string;
  /** The ErrorInfo reason, '' when there was none. */
  reason: string;
  metadata: Record<string, string>;
}
export declare class AttemptSuperseded extends JobfenceError { currentAttempt: number; currentState: string; observationRecorded: boolean }
export declare class AttemptNotIssued extends JobfenceError { currentAttempt: number }
export declare class JobNotRunning extends JobfenceError { state: string; observationRecorded: boolean }
export declare class JobNotFound extends JobfenceError {}
export declare class JobPruned extends JobNotFound {}
export declare class EventsCursorPruned extends JobfenceError {}
export declare class JobFinished extends JobfenceError { state: string }
export declare class LeaseNotExpired extends JobfenceError { currentAttempt: number }
export declare class OperationKeyConflict extends JobfenceError { jobId: number }
export declare class JobNotInManualReview extends JobfenceError {}
export declare class JobNotCancellable extends JobfenceError {}
/** SETTLEMENT_EXCEPTION_NOT_FOUND (NOT_FOUND, operators). */
export declare class SettlementExceptionNotFound extends JobfenceError {}
/** SETTLEMENT_EXCEPTION_MOVED (FAILED_PRECONDITION, operators): someone acted first. */
export declare class SettlementExceptionMoved extends JobfenceError {}
export declare class InvalidRequest extends JobfenceError { violations: Array<[string, string]> }
/** The call may have been applied; after a Claim or Takeover: hold nothing. */
export declare class OutcomeUnknown extends JobfenceError {}
export declare class CommitOutcomeUnknown extends OutcomeUnknown {}
/** Nothing was applied; retry after a backoff. */
export declare class Unavailable extends JobfenceError {}
export declare class DatabaseUnavailable extends Unavailable {}
export declare class TransactionConflict extends Unavailable {}
export declare class Overloaded extends Unavailable { retryAfterSeconds: number | null }
/** NO_COORDINATOR_SERVING: the load balancer found no coordinator serving; nothing was forwarded. */
export declare class NoCoordinatorServing extends Unavailable {}
export declare class InternalError extends JobfenceError {}
export declare class ServerShuttingDown extends JobfenceError {}
/** Refused for who the caller is: nothing was applied; never retried. */
export declare class NotAuthorized extends JobfenceError {}
/** NotAuthorized under the name every jobfence client gives it: the same class. */
export { NotAuthorized as Denied };
export declare class Unauthenticated extends NotAuthorized {}
export declare class CredentialMissing extends Unauthenticated {}
export declare class CredentialInvalid extends Unauthenticated {}
export declare class CredentialExpired extends Unauthenticated {}
export declare class PermissionDenied extends NotAuthorized {}
export declare class RoleNotAllowed extends PermissionDenied {}
export declare class QueueNotAllowed extends PermissionDenied { queue: string; jobId: number }
export declare class OperatorMismatch extends PermissionDenied {}
/** A Takeover the provider's budget cannot pay for now: nothing taken; ask again after retryAfterSeconds. */
export declare class ProviderHeld extends JobfenceError { retryAfterSeconds: number | null; provider: string }
export declare class ProviderBudgetExhausted extends ProviderHeld {}
export declare class ProviderPaused extends ProviderHeld {}
export declare class ProviderThrottled extends ProviderHeld {}

/** The major version of the jobfence API this client speaks. */
export declare const API_MAJOR: 1;
/** The response header a coordinator names its API version in. */
export declare const API_VERSION_HEADER: 'jobfence-api-version';
/**
 * The coordinator speaks another major version of the API: its answer was
 * not read; never retried (the call may have been applied by it). A
 * coordinator without the header is accepted.
 */
export declare class ApiVersionUnsupported extends JobfenceError {
  /** The version the coordinator named. */
  coordinator: string;
}

export declare const DOMAIN: 'jobfence';
/** Every ErrorInfo reason the coordinator sends, and its class. */
export declare const REASONS: Readonly<Record<string, typeof JobfenceError>>;
export declare const errors: {
  REASONS: typeof REASONS;
  fromStatus(code: number, message: string, statusBytes: Uint8Array | null): JobfenceError;
  retryableWrite(err: unknown): boolean;
  retryableClaim(err: unknown): boolean;
};
