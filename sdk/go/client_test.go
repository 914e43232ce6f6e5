package jobfence

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	pb "github.com/jobfence/jobfence/sdk/go/jobfencepb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// fake is a coordinator whose answers the test scripts, recording what it
// was asked. Everything the client decides is checked against a real
// gRPC server on loopback, with real status details on the wire.
type fake struct {
	pb.UnimplementedJobCoordinatorServer
	mu        sync.Mutex
	claims    []*pb.ClaimRequest
	takeovers int
	fails     []*pb.FailRequest
	observed  []*pb.RecordObservationRequest
	// errs are answered, in turn, before the call succeeds.
	errs    map[string][]error
	version string
	jobs    []*pb.ClaimedJob
}

func (f *fake) next(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs[method]) == 0 {
		return nil
	}
	err := f.errs[method][0]
	f.errs[method] = f.errs[method][1:]
	return err
}

func (f *fake) header(ctx context.Context) {
	if f.version != "" {
		grpc.SetHeader(ctx, metadata.Pairs(APIVersionHeader, f.version))
	}
}

func (f *fake) Claim(ctx context.Context, r *pb.ClaimRequest) (*pb.ClaimResponse, error) {
	f.header(ctx)
	f.mu.Lock()
	f.claims = append(f.claims, r)
	f.mu.Unlock()
	if err := f.next("Claim"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := int(r.GetMaxJobs())
	if n > len(f.jobs) {
		n = len(f.jobs)
	}
	out := f.jobs[:n]
	f.jobs = f.jobs[n:]
	return &pb.ClaimResponse{Jobs: out}, nil
}

func (f *fake) Complete(ctx context.Context, r *pb.CompleteRequest) (*pb.CompleteResponse, error) {
	f.header(ctx)
	if err := f.next("Complete"); err != nil {
		return nil, err
	}
	return &pb.CompleteResponse{Job: &pb.Job{JobId: r.GetJobId(), Attempt: r.GetAttempt(),
		State: pb.JobState_JOB_STATE_SUCCEEDED}}, nil
}

func (f *fake) Fail(ctx context.Context, r *pb.FailRequest) (*pb.FailResponse, error) {
	f.header(ctx)
	f.mu.Lock()
	f.fails = append(f.fails, r)
	f.mu.Unlock()
	if err := f.next("Fail"); err != nil {
		return nil, err
	}
	return &pb.FailResponse{Job: &pb.Job{JobId: r.GetJobId()}, Applied: r.GetDisposition()}, nil
}

func (f *fake) RecordObservation(ctx context.Context,
	r *pb.RecordObservationRequest) (*pb.RecordObservationResponse, error) {
	f.mu.Lock()
	f.observed = append(f.observed, r)
	f.mu.Unlock()
	return &pb.RecordObservationResponse{Observation: &pb.Observation{JobId: r.GetJobId()}}, nil
}

func refusal(code codes.Code, reason string, meta map[string]string, retry time.Duration) error {
	st := status.New(code, "refused: "+reason)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: meta}
	var err error
	if retry > 0 {
		st, err = st.WithDetails(info, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	} else {
		st, err = st.WithDetails(info)
	}
	if err != nil {
		panic(err)
	}
	return st.Err()
}

func start(t *testing.T, f pb.JobCoordinatorServer) *Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterJobCoordinatorServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c, err := Dial(context.Background(), Config{
		Target: lis.Addr().String(), WorkerID: "go-1", Queue: "refunds",
		Retry: RetryPolicy{Initial: time.Millisecond, Max: 5 * time.Millisecond, MaxElapsed: 2 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func claimed(id, attempt uint64) *pb.ClaimedJob {
	return &pb.ClaimedJob{Job: &pb.Job{JobId: id, Attempt: attempt, OperationKey: "refund-1",
		State: pb.JobState_JOB_STATE_RUNNING, NextAction: pb.NextAction_NEXT_ACTION_EXECUTE}}
}

func TestEveryReasonIsTypedAndMatchesItsKind(t *testing.T) {
	f := &fake{errs: map[string][]error{"Complete": {
		refusal(codes.FailedPrecondition, "ATTEMPT_SUPERSEDED",
			map[string]string{"current_attempt": "8", "current_state": "succeeded"}, 0),
	}}, jobs: []*pb.ClaimedJob{claimed(1, 7)}}
	c := start(t, f)
	jobs, err := c.Claim(context.Background(), 1, 0)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim: %v %v", jobs, err)
	}
	_, err = jobs[0].Complete(context.Background(), "re_1", `{"id":"re_1"}`)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ReasonAttemptSuperseded) || !errors.Is(err, ErrNotHolder) {
		t.Fatalf("want a typed ATTEMPT_SUPERSEDED, got %v", err)
	}
	if want := "jobfence: ATTEMPT_SUPERSEDED (FailedPrecondition): refused: ATTEMPT_SUPERSEDED"; e.Error() != want {
		t.Fatalf("the message: %q, want %q", e.Error(), want)
	}
	if e.CurrentAttempt() != 8 || !e.ObservationRecorded {
		t.Fatalf("current attempt %d, recorded %v", e.CurrentAttempt(), e.ObservationRecorded)
	}
	if len(f.observed) != 1 || f.observed[0].GetDedupKey() != "worker:go-1:re_1" ||
		f.observed[0].GetOutcome() != pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED {
		t.Fatalf("the late result is kept as evidence: %v", f.observed)
	}
	if !jobs[0].Settled() {
		t.Fatal("a superseded handle is settled")
	}
	if errors.Is(err, ErrNothingApplied) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatal("a refusal is neither retryable nor unknown")
	}
}

func TestNothingAppliedIsRetriedAndCounted(t *testing.T) {
	f := &fake{errs: map[string][]error{"Claim": {
		refusal(codes.Unavailable, "DATABASE_UNAVAILABLE", nil, 0),
		refusal(codes.ResourceExhausted, "OVERLOADED", nil, 3*time.Millisecond),
		refusal(codes.Unavailable, "NO_COORDINATOR_SERVING", nil, 0),
	}}, jobs: []*pb.ClaimedJob{claimed(1, 1)}}
	c := start(t, f)
	jobs, err := c.Claim(context.Background(), 1, 0)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim after three refusals that applied nothing: %v %v", jobs, err)
	}
	got := c.Retries()
	if got[ReasonDatabaseUnavailable] != 1 || got[ReasonOverloaded] != 1 || got[ReasonNoCoordinatorServing] != 1 {
		t.Fatalf("retries counted by reason: %v", got)
	}
}

func TestAnUnclearClaimIsNeverRetriedButAWriteIs(t *testing.T) {
	unknown := refusal(codes.Unavailable, "COMMIT_OUTCOME_UNKNOWN", nil, 0)
	f := &fake{errs: map[string][]error{"Claim": {unknown}, "Fail": {unknown}},
		jobs: []*pb.ClaimedJob{claimed(1, 1)}}
	c := start(t, f)
	_, err := c.Claim(context.Background(), 1, 0)
	if !errors.Is(err, ErrOutcomeUnknown) || len(f.claims) != 1 {
		t.Fatalf("an unclear claim holds nothing and is not sent again: %v, %d claims", err, len(f.claims))
	}
	jobs, err := c.Claim(context.Background(), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jobs[0].Fail(context.Background(), RetryExecute, "503", time.Second)
	if err != nil || len(f.fails) != 2 || out.Applied != RetryExecute {
		t.Fatalf("a write is sent again through an unknown outcome: %v, %d fails", err, len(f.fails))
	}
}

func TestAThrottledFailCarriesTheProvidersRetryAfter(t *testing.T) {
	f := &fake{jobs: []*pb.ClaimedJob{claimed(1, 1)}}
	c := start(t, f)
	jobs, _ := c.Claim(context.Background(), 1, 0)
	if _, err := jobs[0].FailThrottled(context.Background(), RetryExecute, "429", 2*time.Second,
		2*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := f.fails[0].GetProviderRetryAfter().AsDuration(); got != 2*time.Second {
		t.Fatalf("provider_retry_after %v", got)
	}
	if f.fails[0].GetAttempt() != 1 {
		t.Fatal("the write presents the handle's attempt")
	}
}

func (f *fake) Takeover(ctx context.Context, r *pb.TakeoverRequest) (*pb.TakeoverResponse, error) {
	f.header(ctx)
	f.mu.Lock()
	f.takeovers++
	f.mu.Unlock()
	if err := f.next("Takeover"); err != nil {
		return nil, err
	}
	return &pb.TakeoverResponse{Claimed: claimed(r.GetJobId(), 2)}, nil
}

func TestATakeoverHeldByTheBudgetSaysWhenToAskAgain(t *testing.T) {
	f := &fake{errs: map[string][]error{"Takeover": {
		refusal(codes.ResourceExhausted, "PROVIDER_BUDGET_EXHAUSTED",
			map[string]string{"provider": "stripe", "limit": "rate"}, 1500*time.Millisecond),
	}}}
	c := start(t, f)
	_, err := c.Takeover(context.Background(), 7)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrProviderHeld) || e.RetryAfter != 1500*time.Millisecond ||
		e.Metadata["provider"] != "stripe" {
		t.Fatalf("%+v", err)
	}
	if f.takeovers != 1 {
		t.Fatalf("a budget refusal is the caller's to wait out, not retried: %d takeovers", f.takeovers)
	}
}

func TestACoordinatorOfAnotherMajorVersionIsRefused(t *testing.T) {
	f := &fake{version: "2.0.0", jobs: []*pb.ClaimedJob{claimed(1, 1)}}
	c := start(t, f)
	_, err := c.Claim(context.Background(), 1, 0)
	if !errors.Is(err, ErrAPIVersion) {
		t.Fatalf("want ErrAPIVersion, got %v", err)
	}
	f2 := &fake{version: "1.7.0", jobs: []*pb.ClaimedJob{claimed(1, 1)}}
	if _, err := start(t, f2).Claim(context.Background(), 1, 0); err != nil {
		t.Fatalf("1.x is spoken: %v", err)
	}
}

func TestAConnectionNeverMadeAppliedNothing(t *testing.T) {
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := lis.Addr().String()
	lis.Close()
	c, err := Dial(context.Background(), Config{Target: addr, WorkerID: "w", Queue: "q",
		Retry: RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxElapsed: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Claim(context.Background(), 1, 0)
	if !errors.Is(err, ErrNothingApplied) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("connection refused: nothing was sent: %v", err)
	}
	if c.Retries()[""] == 0 {
		t.Fatal("it was retried")
	}
}

func TestARefusedStreamAppliedNothingButALostOneMayHave(t *testing.T) {
	// grpc-go's own texts for the two (http2_client.go).
	refused := fromStatus(status.Error(codes.Unavailable,
		"stream terminated by RST_STREAM with error code: REFUSED_STREAM"))
	if !errors.Is(refused, ErrNothingApplied) || errors.Is(refused, ErrOutcomeUnknown) || !retryClaim(refused) {
		t.Fatalf("REFUSED_STREAM: the request was not processed: %+v", refused)
	}
	lost := fromStatus(status.Error(codes.Unavailable, "transport is closing"))
	if errors.Is(lost, ErrNothingApplied) || !errors.Is(lost, ErrOutcomeUnknown) || retryClaim(lost) {
		t.Fatalf("a connection lost after the request left: outcome unknown: %+v", lost)
	}
}

func TestRunReleasesAJobItsHandlerLeft(t *testing.T) {
	f := &fake{jobs: []*pb.ClaimedJob{claimed(1, 1), claimed(2, 1)}}
	c := start(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	var handled sync.WaitGroup
	handled.Add(2)
	go func() { handled.Wait(); cancel() }()
	err := c.Run(ctx, func(ctx context.Context, job *Job) error {
		defer handled.Done()
		if job.ID() == 1 {
			_, err := job.Complete(ctx, "re_1", "")
			return err
		}
		return errors.New("provider timed out")
	}, RunOptions{Concurrency: 2, Wait: 10 * time.Millisecond})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run ends with its context: %v", err)
	}
	if len(f.fails) != 1 || f.fails[0].GetJobId() != 2 ||
		f.fails[0].GetDisposition() != pb.FailDisposition_FAIL_DISPOSITION_RETRY_RECONCILE {
		t.Fatalf("the unsettled job is released to reconcile: %v", f.fails)
	}
}

func TestRunStopsOnADenial(t *testing.T) {
	f := &fake{errs: map[string][]error{"Claim": {
		refusal(codes.PermissionDenied, "QUEUE_NOT_ALLOWED", map[string]string{"queue": "refunds"}, 0),
	}}}
	c := start(t, f)
	err := c.Run(context.Background(), func(context.Context, *Job) error { return nil }, RunOptions{})
	if !errors.Is(err, ErrDenied) || !errors.Is(err, Reason("QUEUE_NOT_ALLOWED")) {
		t.Fatalf("a denial stops the loop: %v", err)
	}
}

func TestReasonsComeFromTheAPI(t *testing.T) {
	all := map[Reason]bool{}
	for _, r := range Reasons() {
		all[r] = true
	}
	for _, r := range []Reason{ReasonInvalidRequest, ReasonJobNotFound, ReasonAttemptSuperseded,
		ReasonAttemptNotIssued, ReasonJobNotRunning, ReasonJobFinished, ReasonLeaseNotExpired,
		ReasonOperationKeyConflict, ReasonCommitOutcomeUnknown, ReasonDatabaseUnavailable,
		ReasonTransactionConflict, ReasonOverloaded, ReasonNoCoordinatorServing,
		ReasonProviderBudgetExhausted, ReasonProviderPaused, ReasonProviderThrottled, ReasonJobPruned} {
		if !all[r] {
			t.Fatalf("%s is not an API reason", r)
		}
	}
}

func TestTheSharedNamesAreTheEarlierOnes(t *testing.T) {
	// ClaimedJob and ErrUnavailable are the names every jobfence client
	// uses; Job and ErrNothingApplied stay, as the very same type and error.
	var handle *Job = (*ClaimedJob)(nil)
	_ = handle
	if ErrNothingApplied != ErrUnavailable {
		t.Fatal("ErrNothingApplied must be ErrUnavailable")
	}
	e := &Error{Reason: ReasonDatabaseUnavailable, Sent: true}
	if !errors.Is(e, ErrUnavailable) || !errors.Is(e, ErrNothingApplied) {
		t.Fatalf("%v is neither", e)
	}
}
