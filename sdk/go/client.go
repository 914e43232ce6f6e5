// Package jobfence is the Go worker client of jobfence, a job coordinator
// that fences every write back with an attempt (a fencing token).
//
// A Claim or Takeover that committed hands out *ClaimedJob handles; every
// write goes through the handle, which presents the attempt it was
// issued, and the coordinator applies it only while that attempt is the
// job's current one. Refusals are typed: switch on them with errors.Is (a Reason such as
// ReasonAttemptSuperseded, or a kind such as ErrNotHolder) and read the
// details with errors.As(err, &*Error). A late provider result refused as
// stale is kept as an observation. See the package README.
package jobfence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	pb "github.com/jobfence/jobfence/sdk/go/jobfencepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
)

// APIMajor is the major version of the jobfence API this client speaks
// (the proto package jobfence.v1).
const APIMajor = 1

// Version is this client's version: every client of jobfence has the
// version of the top-level Cargo.toml's [workspace.package] (a test holds
// them together).
const Version = "0.2.0"

// APIVersionHeader is the response header a coordinator names its API
// version in (e.g. "1.4.0").
const APIVersionHeader = "jobfence-api-version"

// Client is a worker's connection to one coordinator. Safe for
// concurrent use.
type Client struct {
	cfg     Config
	conn    *grpc.ClientConn
	rpc     pb.JobCoordinatorClient
	retries Retries

	// versionErr is set once, by the first answer that names an API
	// version this client does not speak (an error), or does (nil).
	versionMu      sync.Mutex
	versionChecked bool
	versionErr     error
}

// Dial connects to cfg.Target (lazily: a coordinator that is down is
// retried by the calls, within their policy).
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	opts, err := cfg.Credentials.dialOptions()
	if err != nil {
		return nil, err
	}
	target := strings.TrimPrefix(strings.TrimPrefix(cfg.Target, "http://"), "https://")
	c := &Client{cfg: cfg}
	opts = append(opts, grpc.WithUnaryInterceptor(c.checkVersion))
	// The user-agent names this client first: the coordinator's workers
	// view shows it.
	opts = append(opts, grpc.WithUserAgent("jobfence-go/"+Version))
	conn, err := grpc.DialContext(ctx, target, opts...)
	if err != nil {
		return nil, fmt.Errorf("jobfence: connecting to %s: %w", target, err)
	}
	c.conn, c.rpc = conn, pb.NewJobCoordinatorClient(conn)
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Config is the client's configuration, with its defaults.
func (c *Client) Config() Config { return c.cfg }

// Retries are the calls this client sent again, by reason.
func (c *Client) Retries() map[Reason]uint64 { return c.retries.Snapshot() }

// checkVersion refuses a coordinator whose API major version is not
// APIMajor, read from the first answer that names one; it also sends the
// caller's trace context (WithTraceparent) with the call.
func (c *Client) checkVersion(ctx context.Context, method string, req, reply interface{},
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.versionMu.Lock()
	refused := c.versionErr
	c.versionMu.Unlock()
	if refused != nil {
		return refused
	}
	// The caller's trace, if it gave one (WithTraceparent).
	ctx = withTraceMetadata(ctx)
	// A refusal comes trailers-only: the version is among the trailers.
	var header, trailer metadata.MD
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&header), grpc.Trailer(&trailer))...)
	if v := append(header.Get(APIVersionHeader), trailer.Get(APIVersionHeader)...); len(v) > 0 {
		c.versionMu.Lock()
		if !c.versionChecked {
			c.versionChecked, c.versionErr = true, versionMismatch(v[0])
		}
		refused = c.versionErr
		c.versionMu.Unlock()
		if refused != nil {
			return refused
		}
	}
	return err
}

// ErrAPIVersion: the coordinator speaks another major version of the API.
var ErrAPIVersion = errors.New("jobfence: unsupported API version")

func versionMismatch(v string) error {
	var major int
	if _, err := fmt.Sscanf(v, "%d.", &major); err != nil || major != APIMajor {
		return fmt.Errorf("%w: the coordinator speaks API %q, this client speaks %d.x; use a client of that major version",
			ErrAPIVersion, v, APIMajor)
	}
	return nil
}

func (c *Client) call(ctx context.Context, extra time.Duration, ok retryable,
	f func(context.Context) error) error {
	return do(ctx, c.cfg.Retry, &c.retries, ok, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout+extra)
		defer cancel()
		return f(ctx)
	})
}

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

// Claim asks for up to maxJobs due jobs of the queue and returns their
// handles (maybe none). With wait > 0 the coordinator holds the call until
// a job is due (a long poll) and answers empty when the wait ends. When
// the queue dispatches to a provider, it hands out no more than the
// provider's budget allows now: claim only what you can send.
//
// Errors: ErrOutcomeUnknown (the claim may have committed: hold nothing;
// its jobs come back after their lease), ErrUnavailable after the
// retries, ErrDenied, ReasonInvalidRequest.
func (c *Client) Claim(ctx context.Context, maxJobs uint32, wait time.Duration) ([]*ClaimedJob, error) {
	req := &pb.ClaimRequest{
		Queue: c.cfg.Queue, WorkerId: c.cfg.WorkerID, MaxJobs: maxJobs, Lease: dur(c.cfg.Lease),
	}
	if wait > 0 {
		req.Wait = dur(wait)
	}
	var resp *pb.ClaimResponse
	err := c.call(ctx, wait, retryClaim, func(ctx context.Context) (err error) {
		resp, err = c.rpc.Claim(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	jobs := make([]*ClaimedJob, 0, len(resp.GetJobs()))
	for _, cj := range resp.GetJobs() {
		jobs = append(jobs, c.handle(cj))
	}
	return jobs, nil
}

// Takeover takes over one named job whose lease expired; it always
// starts with NextAction RECONCILE. Errors as Claim, and the refusals
// ReasonLeaseNotExpired, ReasonJobFinished, ReasonJobNotRunning,
// ReasonJobNotFound, and ErrProviderHeld (the provider's budget: ask again
// after the error's RetryAfter).
func (c *Client) Takeover(ctx context.Context, jobID uint64) (*ClaimedJob, error) {
	req := &pb.TakeoverRequest{JobId: jobID, WorkerId: c.cfg.WorkerID, Lease: dur(c.cfg.Lease)}
	var resp *pb.TakeoverResponse
	err := c.call(ctx, 0, retryClaim, func(ctx context.Context) (err error) {
		resp, err = c.rpc.Takeover(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.GetClaimed() == nil {
		return nil, &Error{Code: codes.Internal, Message: "takeover answered without a job", Sent: true}
	}
	return c.handle(resp.GetClaimed()), nil
}

// GetJob reads a job and its observations. A read decides nothing:
// ownership is the attempt a handle holds.
func (c *Client) GetJob(ctx context.Context, jobID uint64) (*pb.Job, []*pb.Observation, error) {
	var resp *pb.GetJobResponse
	err := c.call(ctx, 0, retryWrite, func(ctx context.Context) (err error) {
		resp, err = c.rpc.GetJob(ctx, &pb.GetJobRequest{JobId: jobID})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return resp.GetJob(), resp.GetObservations(), nil
}

// EnqueueOption sets an optional field of an Enqueue: WithFairnessKey,
// WithPriority.
type EnqueueOption func(*pb.EnqueueRequest)

// WithFairnessKey names among whose jobs claims go round-robin within the
// queue and the priority (a merchant, a tenant; at most 128 bytes, not
// blank): docs/design.md rule 18. Jobs without one share one key.
func WithFairnessKey(key string) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.FairnessKey = key }
}

// WithPriority sets the job's priority, 1 (lowest) to 9 (most urgent); 0
// asks for the default, 5. Each step moves the job 100 rounds of the fair
// order ahead or back (rule 18). Above 9 the coordinator refuses it
// (ReasonInvalidRequest, field priority).
func WithPriority(priority uint32) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.Priority = priority }
}

// Enqueue adds a job, idempotent on (queue, operation_key): the same
// request again returns the existing job with created false; the same key
// with another payload is ReasonOperationKeyConflict. The job returned
// carries the priority and fairness key it was given (GetPriority,
// GetFairnessKey).
func (c *Client) Enqueue(ctx context.Context, queue, operationKey, payload string,
	delay time.Duration, opts ...EnqueueOption) (*pb.Job, bool, error) {
	req := &pb.EnqueueRequest{Queue: queue, OperationKey: operationKey, Payload: payload}
	if delay > 0 {
		req.Delay = dur(delay)
	}
	for _, opt := range opts {
		opt(req)
	}
	var resp *pb.EnqueueResponse
	err := c.call(ctx, 0, retryWrite, func(ctx context.Context) (err error) {
		resp, err = c.rpc.Enqueue(ctx, req)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return resp.GetJob(), resp.GetCreated(), nil
}
