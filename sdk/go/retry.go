package jobfence

import (
	"context"
	"errors"
	"math/rand"
	"sync"
	"time"

	"google.golang.org/grpc/status"
)

// RetryPolicy decides how long a call that applied nothing keeps being
// tried: with exponential backoff and jitter, at least the server's
// RetryInfo delay, within the call's context deadline, for at most
// MaxElapsed in all. The default (30 s, backoff from 50 ms up to 2 s: the
// same in every jobfence client) outlasts a 10-second database outage or a
// coordinator restart, so a worker's handler never sees one.
type RetryPolicy struct {
	// Initial backoff (default 50 ms); it doubles up to Max (default 2 s),
	// half of it random (equal jitter).
	Initial, Max time.Duration
	// MaxElapsed bounds the retries of one call (default 30 s); 0 in a
	// policy given to Config means the default, a negative value none.
	MaxElapsed time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.Initial == 0 {
		p.Initial = 50 * time.Millisecond
	}
	if p.Max == 0 {
		p.Max = 2 * time.Second
	}
	if p.MaxElapsed == 0 {
		p.MaxElapsed = 30 * time.Second
	}
	return p
}

var (
	jitterMu sync.Mutex
	jitter   = rand.New(rand.NewSource(time.Now().UnixNano()))
)

// Backoff is the wait before retry number n (1 for the first).
func (p RetryPolicy) Backoff(n int) time.Duration {
	ceiling := p.Initial
	for i := 1; i < n && ceiling < p.Max; i++ {
		ceiling *= 2
	}
	if ceiling > p.Max {
		ceiling = p.Max
	}
	jitterMu.Lock()
	r := jitter.Int63n(int64(ceiling/2) + 1)
	jitterMu.Unlock()
	return ceiling/2 + time.Duration(r)
}

// retryable says which failures of a kind of call may be sent again.
type retryable func(*Error) bool

// Claims and takeovers: only what applied nothing. After an unclear
// claim the worker holds nothing; what it may have taken comes back
// after its lease, through a takeover that reconciles first.
func retryClaim(e *Error) bool { return errors.Is(e, ErrUnavailable) }

// Writes, observations and reads: also an unknown outcome, because the
// coordinator answers an applied write as a replay and de-duplicates
// observations; never a refusal.
func retryWrite(e *Error) bool {
	return errors.Is(e, ErrUnavailable) || errors.Is(e, ErrOutcomeUnknown)
}

// Retries counts the retries the client made since it was made: calls
// sent again because the answer said nothing was applied (or, for a
// write, because the outcome was unknown).
type Retries struct {
	mu sync.Mutex
	n  map[Reason]uint64
}

func (r *Retries) add(why Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[Reason]uint64{}
	}
	r.n[why]++
}

// Snapshot returns the retries by reason ("" for a transport failure).
func (r *Retries) Snapshot() map[Reason]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[Reason]uint64, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// do runs call until it succeeds, fails in a way that may not be
// retried, the policy's time is up, or ctx ends.
func do(ctx context.Context, p RetryPolicy, counted *Retries, ok retryable,
	call func(context.Context) error) error {
	started := time.Now()
	for n := 1; ; n++ {
		err := call(ctx)
		if err == nil {
			return nil
		}
		if _, isStatus := status.FromError(err); !isStatus {
			// Not an answer of the coordinator (e.g. ErrAPIVersion).
			return err
		}
		e := fromStatus(err)
		if !ok(e) {
			return e
		}
		wait := p.Backoff(n)
		if e.RetryAfter > wait {
			wait = e.RetryAfter
		}
		if p.MaxElapsed > 0 && time.Since(started)+wait > p.MaxElapsed {
			return e
		}
		if dl, has := ctx.Deadline(); has && time.Until(dl) < wait {
			return e
		}
		counted.add(e.Reason)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return e
		case <-t.C:
		}
	}
}
