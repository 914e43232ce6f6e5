package jobfence

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"
)

// RunOptions tune Run.
type RunOptions struct {
	// Concurrency is how many jobs are handled at once (default 1); Run
	// claims only for free slots.
	Concurrency int
	// Wait is the long poll of each Claim (default 10 s).
	Wait time.Duration
	// OnClaimError hears a claim that failed after the client's retries
	// (the loop then backs off and claims again); default: a log line.
	OnClaimError func(error)
}

// Handler handles one job: it talks to the provider with
// job.OperationKey() as the idempotency key and writes the result back
// through the job (Complete, Fail, FailThrottled). A job it leaves without
// a write that settled it is released with RetryReconcile: the handler
// may have reached the provider.
type Handler func(ctx context.Context, job *ClaimedJob) error

// Run claims and handles jobs until ctx ends, at most Concurrency at once.
// A claim refused for who the caller is (ErrDenied) or as an invalid
// request cannot succeed by asking again: Run stops claiming, lets the
// handlers in flight finish and returns that error. On ctx's end it stops
// claiming, waits for the handlers in flight (their ctx is not cancelled,
// so they can write back), and returns ctx's error.
func (c *Client) Run(ctx context.Context, handler Handler, opts RunOptions) error {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	if opts.Wait <= 0 {
		opts.Wait = 10 * time.Second
	}
	if opts.OnClaimError == nil {
		opts.OnClaimError = func(err error) {
			if errors.Is(err, ErrOutcomeUnknown) {
				// Not a failure to retry: the claim may have committed, and
				// what it took comes back after its lease, reconciled.
				log.Printf("jobfence: claim outcome unknown, holding nothing; claiming again: %v", err)
				return
			}
			log.Printf("jobfence: claim failed, claiming again: %v", err)
		}
	}
	slots := make(chan struct{}, opts.Concurrency)
	var handlers sync.WaitGroup
	defer handlers.Wait()
	// Handlers write back on a context that outlives a cancelled Run.
	work := context.Background()
	failures := 0
	// Once Run returns (it stopped claiming), the handlers' write-backs
	// ask for no next job.
	var stop stopFlag
	defer stop.stopped.Store(true)
	stopping := func() bool { return ctx.Err() != nil || stop.stopping() }
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case slots <- struct{}{}:
		}
		free := 1
		for free < opts.Concurrency {
			select {
			case slots <- struct{}{}:
				free++
				continue
			default:
			}
			break
		}
		jobs, err := c.Claim(ctx, uint32(free), opts.Wait)
		for i := len(jobs); i < free; i++ {
			<-slots
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, ErrDenied) || errors.Is(err, ReasonInvalidRequest) {
				return fmt.Errorf("jobfence: claiming stopped: %w", err)
			}
			opts.OnClaimError(err)
			failures++
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(c.cfg.Retry.Backoff(failures)):
			}
			continue
		}
		failures = 0
		for _, job := range jobs {
			// Its Complete or Fail asks for the next job for the slot it
			// frees (docs/design.md rule 16); the handler then runs on it.
			job.next = c.newNextAsk(stopping)
			handlers.Add(1)
			go func(job *ClaimedJob) {
				defer handlers.Done()
				defer func() { <-slots }()
				for current := job; current != nil; current = current.TakeNextJob() {
					c.handleOne(work, handler, current)
				}
			}(job)
		}
	}
}

func (c *Client) handleOne(ctx context.Context, handler Handler, job *ClaimedJob) {
	why := "handler returned without writing back"
	func() {
		defer func() {
			if p := recover(); p != nil {
				why = fmt.Sprintf("handler panicked: %v", p)
			}
		}()
		if err := handler(ctx, job); err != nil {
			why = "handler failed: " + err.Error()
		}
	}()
	if !job.Settled() {
		if _, err := job.Fail(ctx, RetryReconcile, why, time.Second); err != nil &&
			!errors.Is(err, ErrNotHolder) {
			log.Printf("jobfence: could not release job %d: %v", job.ID(), err)
		}
	}
}
