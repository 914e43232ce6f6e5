package jobfence

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log"
	"sync"
	"time"

	pb "github.com/jobfence/jobfence/sdk/go/jobfencepb"
)

// Disposition is how Fail disposes of a job (the API's FailDisposition).
type Disposition int32

const (
	// RetryReconcile: ready again after the delay, to ask the provider
	// what happened first (an unknown or pending outcome).
	RetryReconcile = Disposition(pb.FailDisposition_FAIL_DISPOSITION_RETRY_RECONCILE)
	// RetryExecute: send again with the same operation_key; the
	// coordinator allows it only inside the provider's resend window.
	RetryExecute = Disposition(pb.FailDisposition_FAIL_DISPOSITION_RETRY_EXECUTE)
	// Failed: terminal, the outcome is known to be a failure.
	Failed = Disposition(pb.FailDisposition_FAIL_DISPOSITION_FAILED)
	// ManualReview: park the job for an operator.
	ManualReview = Disposition(pb.FailDisposition_FAIL_DISPOSITION_MANUAL_REVIEW)
)

func (d Disposition) String() string {
	return pb.FailDisposition(d).String()
}

// ClaimedJob is a job this worker holds: handed out by a committed Claim
// or Takeover, with the attempt it was issued. Every write presents that
// attempt. Not safe for concurrent writes (one handler owns a job). The
// Rust, Python and Node clients name their handle ClaimedJob too.
type ClaimedJob struct {
	client  *Client
	attempt uint64
	// Job is the job as last seen (after the hand-out, then after each
	// applied write).
	Job *pb.Job
	// Takeover: this hand-out took over an expired lease (NextAction is
	// then always RECONCILE).
	Takeover bool
	// Observations recorded for the job so far, oldest first.
	Observations []*pb.Observation

	mu      sync.Mutex
	settled bool
	// next: set by AskForNextJob (Run does it); handed: the jobs a
	// write-back brought.
	next   *nextAsk
	handed []*pb.ClaimedJob
}

// Job is the earlier name of ClaimedJob, the same type.
//
// Deprecated: use ClaimedJob, the name every jobfence client gives its
// handle (Job is also the API's message, pb.Job).
type Job = ClaimedJob

func (c *Client) handle(cj *pb.ClaimedJob) *ClaimedJob {
	return &ClaimedJob{
		client: c, attempt: cj.GetJob().GetAttempt(), Job: cj.GetJob(),
		Takeover: cj.GetTakeover(), Observations: cj.GetObservations(),
	}
}

// ID is the job's id.
func (j *ClaimedJob) ID() uint64 { return j.Job.GetJobId() }

// OperationKey is THE idempotency key to send to the provider. It never
// changes across attempts, so the provider de-duplicates a resend or a
// reconcile by a later attempt. Never build a provider key from Attempt.
func (j *ClaimedJob) OperationKey() string { return j.Job.GetOperationKey() }

// Attempt is the fencing token this handle presents; for logs only.
func (j *ClaimedJob) Attempt() uint64 { return j.attempt }

// Payload is the job's payload as enqueued.
func (j *ClaimedJob) Payload() string { return j.Job.GetPayload() }

// Priority is the job's priority, 1 (lowest) to 9 (most urgent); 5 unless
// its enqueue asked for another (docs/design.md rule 18).
func (j *ClaimedJob) Priority() uint32 { return j.Job.GetPriority() }

// FairnessKey is the fairness key the job was enqueued with (a merchant,
// a tenant); empty when it was given none (rule 18).
func (j *ClaimedJob) FairnessKey() string { return j.Job.GetFairnessKey() }

// Reconcile is true when the next action is RECONCILE (always after a
// takeover): ask the provider what happened before sending anything.
func (j *ClaimedJob) Reconcile() bool {
	return j.Job.GetNextAction() == pb.NextAction_NEXT_ACTION_RECONCILE
}

// Settled is true once a write settled the job or told this handle it no
// longer holds it.
func (j *ClaimedJob) Settled() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.settled
}

func (j *ClaimedJob) settle() {
	j.mu.Lock()
	j.settled = true
	j.mu.Unlock()
}

// Written is an applied write. Replayed: this exact call had already been
// applied (its answer was lost); nothing was written again.
type Written struct {
	Job      *pb.Job
	Replayed bool
}

// FailWritten is an applied Fail: Applied may differ from the request when
// the coordinator turned a resend into manual review (OverrideReason).
type FailWritten struct {
	Written
	Applied        Disposition
	OverrideReason string
}

func (j *ClaimedJob) written(job *pb.Job, replayed bool, settles bool) Written {
	if job != nil {
		j.Job = job
	}
	if settles {
		j.settle()
	}
	return Written{Job: j.Job, Replayed: replayed}
}

// refused marks the handle settled when the coordinator says it no
// longer holds the job.
func (j *ClaimedJob) refused(err error) error {
	if errors.Is(err, ErrNotHolder) {
		j.settle()
	}
	return err
}

// Complete marks the job succeeded with the provider's reference and
// result. If the attempt was superseded (or the job left running), the
// result is kept as an observation (source WORKER, outcome SUCCEEDED) and
// the error says ObservationRecorded. Retried through an unknown outcome:
// an applied Complete is answered as a replay.
func (j *ClaimedJob) Complete(ctx context.Context, providerReference, result string) (Written, error) {
	req := &pb.CompleteRequest{
		JobId: j.ID(), Attempt: j.attempt, ProviderReference: providerReference, Result: result,
		Next: j.nextRequest(),
	}
	var resp *pb.CompleteResponse
	err := j.client.call(ctx, 0, retryWrite, func(ctx context.Context) (err error) {
		resp, err = j.client.rpc.Complete(ctx, req)
		return err
	})
	if err == nil {
		err = j.answered(resp.GetNext())
	}
	if err != nil {
		if errors.Is(err, ErrNotHolder) && providerReference != "" {
			e := fromStatus(err)
			e.ObservationRecorded = j.keepEvidence(ctx, providerReference, result)
			return Written{}, j.refused(e)
		}
		return Written{}, j.refused(err)
	}
	return j.written(resp.GetJob(), resp.GetReplayed(), true), nil
}

// Fail reports a failure with a disposition; errText says what went
// wrong (required); retryDelay is how long until a retried job is due.
func (j *ClaimedJob) Fail(ctx context.Context, d Disposition, errText string,
	retryDelay time.Duration) (FailWritten, error) {
	return j.fail(ctx, d, errText, retryDelay, 0)
}

// FailThrottled is Fail for a provider that pushed back (HTTP 429, or 503
// with Retry-After): providerRetryAfter is how long it asked to wait. The
// coordinator then hands out nothing for the provider until then, on every
// coordinator. A throttled send was not processed: RetryExecute.
func (j *ClaimedJob) FailThrottled(ctx context.Context, d Disposition, errText string,
	retryDelay, providerRetryAfter time.Duration) (FailWritten, error) {
	if providerRetryAfter <= 0 {
		providerRetryAfter = time.Second
	}
	return j.fail(ctx, d, errText, retryDelay, providerRetryAfter)
}

func (j *ClaimedJob) fail(ctx context.Context, d Disposition, errText string,
	retryDelay, providerRetryAfter time.Duration) (FailWritten, error) {
	req := &pb.FailRequest{
		JobId: j.ID(), Attempt: j.attempt, Disposition: pb.FailDisposition(d), Error: errText,
		RetryDelay: dur(retryDelay), Next: j.nextRequest(),
	}
	if providerRetryAfter > 0 {
		req.ProviderRetryAfter = dur(providerRetryAfter)
	}
	var resp *pb.FailResponse
	err := j.client.call(ctx, 0, retryWrite, func(ctx context.Context) (err error) {
		resp, err = j.client.rpc.Fail(ctx, req)
		return err
	})
	if err == nil {
		err = j.answered(resp.GetNext())
	}
	if err != nil {
		return FailWritten{}, j.refused(err)
	}
	return FailWritten{
		Written:        j.written(resp.GetJob(), resp.GetReplayed(), true),
		Applied:        Disposition(resp.GetApplied()),
		OverrideReason: resp.GetOverrideReason(),
	}, nil
}

// RenewLease extends the lease to lease from now (DB clock); never
// shortens it.
func (j *ClaimedJob) RenewLease(ctx context.Context, lease time.Duration) (Written, error) {
	req := &pb.RenewLeaseRequest{JobId: j.ID(), Attempt: j.attempt, Lease: dur(lease)}
	var resp *pb.RenewLeaseResponse
	err := j.client.call(ctx, 0, retryWrite, func(ctx context.Context) (err error) {
		resp, err = j.client.rpc.RenewLease(ctx, req)
		return err
	})
	if err != nil {
		return Written{}, j.refused(err)
	}
	return j.written(resp.GetJob(), resp.GetReplayed(), false), nil
}

// RecordObservation records evidence about the job, allowed from any
// attempt, stale included; it never changes the job. dedupKey is unique
// per job: a repeat returns the first observation (duplicate true).
func (j *ClaimedJob) RecordObservation(ctx context.Context, outcome pb.ObservationOutcome,
	providerReference, body, dedupKey string) (*pb.Observation, bool, error) {
	req := &pb.RecordObservationRequest{
		JobId: j.ID(), Attempt: j.attempt, Source: pb.ObservationSource_OBSERVATION_SOURCE_WORKER,
		Outcome: outcome, ProviderReference: providerReference, Body: body, DedupKey: dedupKey,
	}
	var resp *pb.RecordObservationResponse
	err := j.client.call(ctx, 0, retryWrite, func(ctx context.Context) (err error) {
		resp, err = j.client.rpc.RecordObservation(ctx, req)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return resp.GetObservation(), resp.GetDuplicate(), nil
}

func (j *ClaimedJob) keepEvidence(ctx context.Context, providerReference, result string) bool {
	_, _, err := j.RecordObservation(ctx, pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED,
		providerReference, result, ObservationDedupKey(j.client.cfg.WorkerID, providerReference))
	if err != nil {
		log.Printf("jobfence: could not record a late provider result of job %d: %v", j.ID(), err)
		return false
	}
	return true
}

// ObservationDedupKey is worker:<workerID>:<providerReference>, or
// worker-sha256:<hex> of both when longer than 255 bytes: the key every
// jobfence client derives, so one worker reporting one result twice
// records it once.
func ObservationDedupKey(workerID, providerReference string) string {
	plain := "worker:" + workerID + ":" + providerReference
	if len(plain) <= 255 {
		return plain
	}
	h := sha256.New()
	h.Write([]byte(workerID))
	h.Write([]byte{0})
	h.Write([]byte(providerReference))
	return "worker-sha256:" + hex.EncodeToString(h.Sum(nil))
}
