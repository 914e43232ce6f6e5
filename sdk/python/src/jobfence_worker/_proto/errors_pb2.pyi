from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    INVALID_REQUEST: _ClassVar[ErrorReason]
    JOB_NOT_FOUND: _ClassVar[ErrorReason]
    ATTEMPT_SUPERSEDED: _ClassVar[ErrorReason]
    ATTEMPT_NOT_ISSUED: _ClassVar[ErrorReason]
    JOB_NOT_RUNNING: _ClassVar[ErrorReason]
    JOB_FINISHED: _ClassVar[ErrorReason]
    LEASE_NOT_EXPIRED: _ClassVar[ErrorReason]
    OPERATION_KEY_CONFLICT: _ClassVar[ErrorReason]
    JOB_NOT_IN_MANUAL_REVIEW: _ClassVar[ErrorReason]
    JOB_NOT_CANCELLABLE: _ClassVar[ErrorReason]
    COMMIT_OUTCOME_UNKNOWN: _ClassVar[ErrorReason]
    DATABASE_UNAVAILABLE: _ClassVar[ErrorReason]
    TRANSACTION_CONFLICT: _ClassVar[ErrorReason]
    INTERNAL: _ClassVar[ErrorReason]
    OVERLOADED: _ClassVar[ErrorReason]
    SERVER_SHUTTING_DOWN: _ClassVar[ErrorReason]
    NO_COORDINATOR_SERVING: _ClassVar[ErrorReason]
    CREDENTIAL_MISSING: _ClassVar[ErrorReason]
    CREDENTIAL_INVALID: _ClassVar[ErrorReason]
    CREDENTIAL_EXPIRED: _ClassVar[ErrorReason]
    ROLE_NOT_ALLOWED: _ClassVar[ErrorReason]
    QUEUE_NOT_ALLOWED: _ClassVar[ErrorReason]
    OPERATOR_MISMATCH: _ClassVar[ErrorReason]
    PROVIDER_BUDGET_EXHAUSTED: _ClassVar[ErrorReason]
    PROVIDER_PAUSED: _ClassVar[ErrorReason]
    PROVIDER_THROTTLED: _ClassVar[ErrorReason]
    JOB_PRUNED: _ClassVar[ErrorReason]
    EVENTS_CURSOR_PRUNED: _ClassVar[ErrorReason]
    SETTLEMENT_EXCEPTION_NOT_FOUND: _ClassVar[ErrorReason]
    SETTLEMENT_EXCEPTION_MOVED: _ClassVar[ErrorReason]
ERROR_REASON_UNSPECIFIED: ErrorReason
INVALID_REQUEST: ErrorReason
JOB_NOT_FOUND: ErrorReason
ATTEMPT_SUPERSEDED: ErrorReason
ATTEMPT_NOT_ISSUED: ErrorReason
JOB_NOT_RUNNING: ErrorReason
JOB_FINISHED: ErrorReason
LEASE_NOT_EXPIRED: ErrorReason
OPERATION_KEY_CONFLICT: ErrorReason
JOB_NOT_IN_MANUAL_REVIEW: ErrorReason
JOB_NOT_CANCELLABLE: ErrorReason
COMMIT_OUTCOME_UNKNOWN: ErrorReason
DATABASE_UNAVAILABLE: ErrorReason
TRANSACTION_CONFLICT: ErrorReason
INTERNAL: ErrorReason
OVERLOADED: ErrorReason
SERVER_SHUTTING_DOWN: ErrorReason
NO_COORDINATOR_SERVING: ErrorReason
CREDENTIAL_MISSING: ErrorReason
CREDENTIAL_INVALID: ErrorReason
CREDENTIAL_EXPIRED: ErrorReason
ROLE_NOT_ALLOWED: ErrorReason
QUEUE_NOT_ALLOWED: ErrorReason
OPERATOR_MISMATCH: ErrorReason
PROVIDER_BUDGET_EXHAUSTED: ErrorReason
PROVIDER_PAUSED: ErrorReason
PROVIDER_THROTTLED: ErrorReason
JOB_PRUNED: ErrorReason
EVENTS_CURSOR_PRUNED: ErrorReason
SETTLEMENT_EXCEPTION_NOT_FOUND: ErrorReason
SETTLEMENT_EXCEPTION_MOVED: ErrorReason
GRPC_CODE_FIELD_NUMBER: _ClassVar[int]
grpc_code: _descriptor.FieldDescriptor
