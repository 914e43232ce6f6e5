package jobfence

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jobfence/jobfence/sdk/go/jobfencepb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every jobfence refusal.
const ErrorDomain = "jobfence"

// Reason is an ErrorInfo reason the coordinator attaches to a refusal. A
// Reason is itself an error, so a worker switches on it with errors.Is:
//
//	if errors.Is(err, jobfence.ReasonAttemptSuperseded) { ... }
//
// The list comes from the API's ErrorReason enum (jobfencepb), not from
// a hand-written table: see Reasons.
type Reason string

func (r Reason) Error() string { return "jobfence: " + string(r) }

// The reasons a worker acts on. Every reason of the API is in Reasons.
const (
	ReasonInvalidRequest          Reason = "INVALID_REQUEST"
	ReasonJobNotFound             Reason = "JOB_NOT_FOUND"
	ReasonAttemptSuperseded       Reason = "ATTEMPT_SUPERSEDED"
	ReasonAttemptNotIssued        Reason = "ATTEMPT_NOT_ISSUED"
	ReasonJobNotRunning           Reason = "JOB_NOT_RUNNING"
	ReasonJobFinished             Reason = "JOB_FINISHED"
	ReasonLeaseNotExpired         Reason = "LEASE_NOT_EXPIRED"
	ReasonOperationKeyConflict    Reason = "OPERATION_KEY_CONFLICT"
	ReasonCommitOutcomeUnknown    Reason = "COMMIT_OUTCOME_UNKNOWN"
	ReasonDatabaseUnavailable     Reason = "DATABASE_UNAVAILABLE"
	ReasonTransactionConflict     Reason = "TRANSACTION_CONFLICT"
	ReasonOverloaded              Reason = "OVERLOADED"
	ReasonNoCoordinatorServing    Reason = "NO_COORDINATOR_SERVING"
	ReasonProviderBudgetExhausted Reason = "PROVIDER_BUDGET_EXHAUSTED"
	ReasonProviderPaused          Reason = "PROVIDER_PAUSED"
	ReasonProviderThrottled       Reason = "PROVIDER_THROTTLED"
	// The job finished and retention pruned it (NOT_FOUND); the metadata
	// holds its key record. Nothing was written.
	ReasonJobPruned Reason = "JOB_PRUNED"
)

// Kinds of failure, matched with errors.Is whatever the exact reason:
//
//   - ErrOutcomeUnknown: the call may or may not have been applied (a lost
//     COMMIT, or a transport failure after the request left). After a
//     Claim or Takeover: hold nothing (docs/design.md rule 4). After a write:
//     sending the same call again is safe, it is answered as a replay.
//   - ErrUnavailable: the coordinator (or the load balancer) said nothing
//     was applied; retry later (the client already did, within its budget).
//   - ErrDenied: refused for who the caller is (UNAUTHENTICATED or
//     PERMISSION_DENIED); never retried: fix the credential.
//   - ErrNotHolder: this handle no longer holds its job (superseded, or the
//     job left running); stop, and keep any provider result as evidence.
//   - ErrProviderHeld: a Takeover the provider's budget cannot pay for now
//     (RetryAfter says when to ask again).
var (
	ErrOutcomeUnknown = errors.New("jobfence: outcome unknown")
	ErrUnavailable    = errors.New("jobfence: nothing applied")
	ErrDenied         = errors.New("jobfence: denied")
	ErrNotHolder      = errors.New("jobfence: not the holder")
	ErrProviderHeld   = errors.New("jobfence: held by the provider's budget")
)

// ErrNothingApplied is the earlier name of ErrUnavailable: the same error,
// so errors.Is matches either.
//
// Deprecated: use ErrUnavailable, the name the Rust, Python and Node
// clients give this kind too (Unavailable).
var ErrNothingApplied = ErrUnavailable

// Error is a failed jobfence call: its gRPC code, the ErrorInfo reason
// (empty when the status carried none, e.g. a transport failure), the
// metadata (current_attempt, job_id, ...), and the server's RetryInfo
// delay. Use errors.As to read it, errors.Is with a Reason or a kind.
type Error struct {
	Code     codes.Code
	Reason   Reason
	Message  string
	Metadata map[string]string
	// RetryAfter is the google.rpc.RetryInfo delay, 0 when none was sent.
	RetryAfter time.Duration
	// ObservationRecorded: the refused write carried a provider result,
	// which the client kept as an observation (source WORKER).
	ObservationRecorded bool
	// Sent reports whether the request may have reached the coordinator
	// (false only for a connection that was never made).
	Sent bool

	violations map[string]string
}

func (e *Error) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("jobfence: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("jobfence: %s (%s): %s", string(e.Reason), e.Code, e.Message)
}

// Is matches a Reason (the exact one) or one of the kinds above.
func (e *Error) Is(target error) bool {
	if r, ok := target.(Reason); ok {
		return e.Reason == r
	}
	switch target {
	case ErrOutcomeUnknown:
		return e.outcomeUnknown()
	case ErrUnavailable:
		return e.nothingApplied()
	case ErrDenied:
		return e.Code == codes.Unauthenticated || e.Code == codes.PermissionDenied
	case ErrNotHolder:
		return e.Reason == ReasonAttemptSuperseded || e.Reason == ReasonJobNotRunning
	case ErrProviderHeld:
		return e.Reason == ReasonProviderBudgetExhausted || e.Reason == ReasonProviderPaused ||
			e.Reason == ReasonProviderThrottled
	}
	return false
}

// CurrentAttempt is the attempt the refusal named (metadata
// current_attempt), 0 if none.
func (e *Error) CurrentAttempt() uint64 {
	var n uint64
	fmt.Sscan(e.Metadata["current_attempt"], &n)
	return n
}

// Violations are the field violations of an INVALID_REQUEST, field ->
// description (nil otherwise).
func (e *Error) Violations() map[string]string { return e.violations }

func (e *Error) nothingApplied() bool {
	switch e.Reason {
	case ReasonDatabaseUnavailable, ReasonTransactionConflict, ReasonOverloaded,
		ReasonNoCoordinatorServing:
		return true
	case "":
		// A connection that was never made carried no request.
		return !e.Sent
	}
	return false
}

func (e *Error) outcomeUnknown() bool {
	if e.Reason == ReasonCommitOutcomeUnknown {
		return true
	}
	if e.Reason != "" || !e.Sent {
		return false
	}
	switch e.Code {
	case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.Canceled,
		codes.Unknown, codes.Internal:
		return true
	}
	return false
}

// Reasons lists every ErrorInfo reason of the API, from its ErrorReason
// enum (generated from proto/jobfence/v1/errors.proto).
func Reasons() []Reason {
	out := make([]Reason, 0, len(jobfencepb.ErrorReason_name))
	for n, name := range jobfencepb.ErrorReason_name {
		if n != 0 {
			out = append(out, Reason(name))
		}
	}
	return out
}

// fromStatus turns a failed call into an *Error.
func fromStatus(err error) *Error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return already
	}
	st, _ := status.FromError(err)
	out := &Error{Code: st.Code(), Message: st.Message(), Metadata: map[string]string{}, Sent: true}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain {
				out.Reason = Reason(d.GetReason())
				for k, v := range d.GetMetadata() {
					out.Metadata[k] = v
				}
			}
		case *errdetails.RetryInfo:
			if rd := d.GetRetryDelay(); rd != nil {
				out.RetryAfter = time.Duration(rd.GetSeconds())*time.Second +
					time.Duration(rd.GetNanos())
			}
		case *errdetails.BadRequest:
			out.violations = map[string]string{}
			for _, v := range d.GetFieldViolations() {
				out.violations[v.GetField()] = v.GetDescription()
			}
		}
	}
	if out.Reason == "" && neverSent(st) {
		out.Sent = false
	}
	return out
}

// neverSent: a status grpc-go makes up when it could not connect at all
// (the coordinator restarting, nothing listening: no request left), or
// when the server refused the stream with HTTP/2's REFUSED_STREAM, which
// says the request was not processed (RFC 9113, section 8.7; a coordinator
// going away does it). Either way nothing can have been applied.
func neverSent(st *status.Status) bool {
	if st.Code() != codes.Unavailable {
		return false
	}
	m := st.Message()
	return strings.Contains(m, "Error while dialing") || strings.Contains(m, "connection refused") ||
		strings.Contains(m, "REFUSED_STREAM")
}
