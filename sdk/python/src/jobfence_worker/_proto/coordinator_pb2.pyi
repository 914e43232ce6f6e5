import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_READY: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_MANUAL_REVIEW: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class NextAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NEXT_ACTION_UNSPECIFIED: _ClassVar[NextAction]
    NEXT_ACTION_EXECUTE: _ClassVar[NextAction]
    NEXT_ACTION_RECONCILE: _ClassVar[NextAction]

class ObservationSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBSERVATION_SOURCE_UNSPECIFIED: _ClassVar[ObservationSource]
    OBSERVATION_SOURCE_WORKER: _ClassVar[ObservationSource]
    OBSERVATION_SOURCE_WEBHOOK: _ClassVar[ObservationSource]
    OBSERVATION_SOURCE_RECONCILER: _ClassVar[ObservationSource]
    OBSERVATION_SOURCE_OPERATOR: _ClassVar[ObservationSource]
    OBSERVATION_SOURCE_SETTLEMENT: _ClassVar[ObservationSource]

class ObservationOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBSERVATION_OUTCOME_UNSPECIFIED: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_SUCCEEDED: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_PENDING: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_FAILED: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_NOT_FOUND: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_UNKNOWN: _ClassVar[ObservationOutcome]

class FailDisposition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAIL_DISPOSITION_UNSPECIFIED: _ClassVar[FailDisposition]
    FAIL_DISPOSITION_RETRY_RECONCILE: _ClassVar[FailDisposition]
    FAIL_DISPOSITION_RETRY_EXECUTE: _ClassVar[FailDisposition]
    FAIL_DISPOSITION_FAILED: _ClassVar[FailDisposition]
    FAIL_DISPOSITION_MANUAL_REVIEW: _ClassVar[FailDisposition]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_READY: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_MANUAL_REVIEW: JobState
JOB_STATE_CANCELLED: JobState
NEXT_ACTION_UNSPECIFIED: NextAction
NEXT_ACTION_EXECUTE: NextAction
NEXT_ACTION_RECONCILE: NextAction
OBSERVATION_SOURCE_UNSPECIFIED: ObservationSource
OBSERVATION_SOURCE_WORKER: ObservationSource
OBSERVATION_SOURCE_WEBHOOK: ObservationSource
OBSERVATION_SOURCE_RECONCILER: ObservationSource
OBSERVATION_SOURCE_OPERATOR: ObservationSource
OBSERVATION_SOURCE_SETTLEMENT: ObservationSource
OBSERVATION_OUTCOME_UNSPECIFIED: ObservationOutcome
OBSERVATION_OUTCOME_SUCCEEDED: ObservationOutcome
OBSERVATION_OUTCOME_PENDING: ObservationOutcome
OBSERVATION_OUTCOME_FAILED: ObservationOutcome
OBSERVATION_OUTCOME_NOT_FOUND: ObservationOutcome
OBSERVATION_OUTCOME_UNKNOWN: ObservationOutcome
FAIL_DISPOSITION_UNSPECIFIED: FailDisposition
FAIL_DISPOSITION_RETRY_RECONCILE: FailDisposition
FAIL_DISPOSITION_RETRY_EXECUTE: FailDisposition
FAIL_DISPOSITION_FAILED: FailDisposition
FAIL_DISPOSITION_MANUAL_REVIEW: FailDisposition

class Job(_message.Message):
    __slots__ = ("job_id", "queue", "operation_key", "payload", "state", "attempt", "next_action", "run_at", "lease_until", "lease_owner", "first_dispatched_at", "dispatch_count", "provider_reference", "result", "last_error", "state_reason", "created_at", "updated_at", "finished_at", "priority", "fairness_key")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NEXT_ACTION_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    FIRST_DISPATCHED_AT_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_KEY_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    queue: str
    operation_key: str
    payload: str
    state: JobState
    attempt: int
    next_action: NextAction
    run_at: _timestamp_pb2.Timestamp
    lease_until: _timestamp_pb2.Timestamp
    lease_owner: str
    first_dispatched_at: _timestamp_pb2.Timestamp
    dispatch_count: int
    provider_reference: str
    result: str
    last_error: str
    state_reason: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    priority: int
    fairness_key: str
    def __init__(self, job_id: _Optional[int] = ..., queue: _Optional[str] = ..., operation_key: _Optional[str] = ..., payload: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., attempt: _Optional[int] = ..., next_action: _Optional[_Union[NextAction, str]] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_owner: _Optional[str] = ..., first_dispatched_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dispatch_count: _Optional[int] = ..., provider_reference: _Optional[str] = ..., result: _Optional[str] = ..., last_error: _Optional[str] = ..., state_reason: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority: _Optional[int] = ..., fairness_key: _Optional[str] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("observation_id", "job_id", "attempt", "source", "outcome", "provider_reference", "body", "dedup_key", "recorded_at")
    OBSERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    DEDUP_KEY_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    observation_id: int
    job_id: int
    attempt: int
    source: ObservationSource
    outcome: ObservationOutcome
    provider_reference: str
    body: str
    dedup_key: str
    recorded_at: _timestamp_pb2.Timestamp
    def __init__(self, observation_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., source: _Optional[_Union[ObservationSource, str]] = ..., outcome: _Optional[_Union[ObservationOutcome, str]] = ..., provider_reference: _Optional[str] = ..., body: _Optional[str] = ..., dedup_key: _Optional[str] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ("queue", "operation_key", "payload", "delay", "fairness_key", "priority")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    operation_key: str
    payload: str
    delay: _duration_pb2.Duration
    fairness_key: str
    priority: int
    def __init__(self, queue: _Optional[str] = ..., operation_key: _Optional[str] = ..., payload: _Optional[str] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., fairness_key: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    created: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class EnqueueBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("code", "reason", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EnqueueBatchResult(_message.Message):
    __slots__ = ("enqueued", "error")
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    enqueued: EnqueueResponse
    error: ItemError
    def __init__(self, enqueued: _Optional[_Union[EnqueueResponse, _Mapping]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class EnqueueBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EnqueueBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[EnqueueBatchResult, _Mapping]]] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("queue", "worker_id", "max_jobs", "lease", "wait")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    worker_id: str
    max_jobs: int
    lease: _duration_pb2.Duration
    wait: _duration_pb2.Duration
    def __init__(self, queue: _Optional[str] = ..., worker_id: _Optional[str] = ..., max_jobs: _Optional[int] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ClaimedJob(_message.Message):
    __slots__ = ("job", "takeover", "observations")
    JOB_FIELD_NUMBER: _ClassVar[int]
    TAKEOVER_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    job: Job
    takeover: bool
    observations: _containers.RepeatedCompositeFieldContainer[Observation]
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., takeover: _Optional[bool] = ..., observations: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ClaimedJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[ClaimedJob, _Mapping]]] = ...) -> None: ...

class TakeoverRequest(_message.Message):
    __slots__ = ("job_id", "worker_id", "lease")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    worker_id: str
    lease: _duration_pb2.Duration
    def __init__(self, job_id: _Optional[int] = ..., worker_id: _Optional[str] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class TakeoverResponse(_message.Message):
    __slots__ = ("claimed",)
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    claimed: ClaimedJob
    def __init__(self, claimed: _Optional[_Union[ClaimedJob, _Mapping]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "lease")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    lease: _duration_pb2.Duration
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("job", "replayed")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "provider_reference", "result", "next")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    provider_reference: str
    result: str
    next: NextJobsRequest
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., provider_reference: _Optional[str] = ..., result: _Optional[str] = ..., next: _Optional[_Union[NextJobsRequest, _Mapping]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("job", "replayed", "next")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    job: Job
    replayed: bool
    next: NextJobs
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., replayed: _Optional[bool] = ..., next: _Optional[_Union[NextJobs, _Mapping]] = ...) -> None: ...

class NextJobsRequest(_message.Message):
    __slots__ = ("queue", "worker_id", "max_jobs", "lease", "wait")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    worker_id: str
    max_jobs: int
    lease: _duration_pb2.Duration
    wait: _duration_pb2.Duration
    def __init__(self, queue: _Optional[str] = ..., worker_id: _Optional[str] = ..., max_jobs: _Optional[int] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class NextJobs(_message.Message):
    __slots__ = ("jobs", "write_refused")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    WRITE_REFUSED_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ClaimedJob]
    write_refused: WriteRefusal
    def __init__(self, jobs: _Optional[_Iterable[_Union[ClaimedJob, _Mapping]]] = ..., write_refused: _Optional[_Union[WriteRefusal, _Mapping]] = ...) -> None: ...

class WriteRefusal(_message.Message):
    __slots__ = ("code", "reason", "metadata", "message")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    metadata: _containers.ScalarMap[str, str]
    message: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., message: _Optional[str] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "disposition", "error", "retry_delay", "provider_retry_after", "next")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DISPOSITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    disposition: FailDisposition
    error: str
    retry_delay: _duration_pb2.Duration
    provider_retry_after: _duration_pb2.Duration
    next: NextJobsRequest
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., disposition: _Optional[_Union[FailDisposition, str]] = ..., error: _Optional[str] = ..., retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., provider_retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., next: _Optional[_Union[NextJobsRequest, _Mapping]] = ...) -> None: ...

class FailResponse(_message.Message):
    __slots__ = ("job", "applied", "override_reason", "replayed", "next")
    JOB_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_REASON_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    job: Job
    applied: FailDisposition
    override_reason: str
    replayed: bool
    next: NextJobs
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., applied: _Optional[_Union[FailDisposition, str]] = ..., override_reason: _Optional[str] = ..., replayed: _Optional[bool] = ..., next: _Optional[_Union[NextJobs, _Mapping]] = ...) -> None: ...

class RecordObservationRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "source", "outcome", "provider_reference", "body", "dedup_key")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    DEDUP_KEY_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    source: ObservationSource
    outcome: ObservationOutcome
    provider_reference: str
    body: str
    dedup_key: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., source: _Optional[_Union[ObservationSource, str]] = ..., outcome: _Optional[_Union[ObservationOutcome, str]] = ..., provider_reference: _Optional[str] = ..., body: _Optional[str] = ..., dedup_key: _Optional[str] = ...) -> None: ...

class RecordObservationResponse(_message.Message):
    __slots__ = ("observation", "duplicate")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    observation: Observation
    duplicate: bool
    def __init__(self, observation: _Optional[_Union[Observation, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job", "observations")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    job: Job
    observations: _containers.RepeatedCompositeFieldContainer[Observation]
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., observations: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ...) -> None: ...
