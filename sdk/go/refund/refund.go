// Package refund is a refund worker on the jobfence Go client: the same
// reconcile-first protocol as the Rust, Python and Node ones, against the
// fake payment provider's Stripe-style API (docs/fake-provider.md).
//
// The rules it follows:
//   - operation_key is the idempotency key and the merchant reference; the
//     attempt is never sent to the provider.
//   - EXECUTE: send the refund. A timeout or a cut connection is an unknown
//     outcome: retry as RECONCILE, never "not refunded". A 5xx did nothing:
//     ask for a resend (RetryExecute).
//   - RECONCILE: look the refund up by merchant reference. Succeeded:
//     Complete; pending: reconcile again later; not found: ask for a
//     resend, which the coordinator allows only inside the resend window.
//   - A 429 did nothing: Fail with the same next action, due after the
//     Retry-After, reported as provider_retry_after so the coordinator
//     holds every worker's hand-outs for the provider until then.
//   - A refused write (ErrNotHolder) means someone else holds the job: stop;
//     the client keeps any provider result as evidence.
package refund

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	jobfence "github.com/jobfence/jobfence/sdk/go"
)

// Refund is the provider's refund object.
type Refund struct {
	ID                string `json:"id"`
	PaymentID         string `json:"payment_id"`
	Amount            int64  `json:"amount"`
	Currency          string `json:"currency"`
	MerchantReference string `json:"merchant_reference"`
	Status            string `json:"status"`
}

// Provider talks to the fake provider.
type Provider struct {
	Base string
	HTTP *http.Client
}

// NewProvider is a client of the provider at base with a per-request
// timeout.
func NewProvider(base string, timeout time.Duration) *Provider {
	return &Provider{Base: strings.TrimRight(base, "/") + "/", HTTP: &http.Client{Timeout: timeout}}
}

// The provider's answers, as the protocol needs them.
var (
	// errUnknown: the request may have been processed (a timeout, a cut
	// connection): reconcile.
	errUnknown = errors.New("outcome unknown")
	// errNothingDone: certainly not processed (refused connection, 5xx).
	errNothingDone = errors.New("provider did nothing")
	// errRefused: a 4xx other than 429.
	errRefused = errors.New("provider refused")
)

// throttled is a 429 and how long the provider asked to wait.
type throttled struct{ retryAfter time.Duration }

func (t *throttled) Error() string { return fmt.Sprintf("HTTP 429, retry after %v", t.retryAfter) }

// retryAfter reads Retry-After-Ms (the fake provider's precise one), else
// Retry-After in seconds, else 1 s; at most the coordinator's 24 h.
func retryAfter(h http.Header) time.Duration {
	wait := time.Second
	if v, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && v >= 0 && !math.IsInf(v, 0) {
		wait = time.Duration(v * float64(time.Millisecond))
	} else if v, err := strconv.ParseFloat(h.Get("Retry-After"), 64); err == nil && v >= 0 && !math.IsInf(v, 0) {
		wait = time.Duration(v * float64(time.Second))
	}
	if wait < time.Millisecond {
		wait = time.Millisecond
	}
	if wait > 24*time.Hour {
		wait = 24 * time.Hour
	}
	return wait
}

func (p *Provider) do(req *http.Request, out interface{}) error {
	resp, err := p.HTTP.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return fmt.Errorf("%w: %v", errNothingDone, err)
		}
		return fmt.Errorf("%w: %v", errUnknown, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return fmt.Errorf("%w: reading the answer: %v", errUnknown, err)
	case resp.StatusCode == http.StatusTooManyRequests:
		return &throttled{retryAfter(resp.Header)}
	case resp.StatusCode >= 500:
		return fmt.Errorf("%w: HTTP %d", errNothingDone, resp.StatusCode)
	case resp.StatusCode >= 400:
		return fmt.Errorf("%w: HTTP %d: %s", errRefused, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%w: %v", errUnknown, err)
	}
	return nil
}

// Create sends a refund with idempotencyKey.
func (p *Provider) Create(ctx context.Context, idempotencyKey string, params map[string]interface{}) (Refund, error) {
	b, _ := json.Marshal(params)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.Base+"v1/refunds", bytes.NewReader(b))
	if err != nil {
		return Refund{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	var r Refund
	return r, p.do(req, &r)
}

// Find looks refunds up by merchant reference.
func (p *Provider) Find(ctx context.Context, reference string) ([]Refund, error) {
	u := p.Base + "v1/refunds?" + url.Values{"merchant_reference": {reference}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	var out struct {
		Data []Refund `json:"data"`
	}
	return out.Data, p.do(req, &out)
}

// Handler returns the jobfence handler of one refund job.
func Handler(p *Provider) jobfence.Handler {
	return func(ctx context.Context, job *jobfence.ClaimedJob) error {
		var payload struct {
			PaymentID string `json:"payment_id"`
			Amount    int64  `json:"amount"`
			Currency  string `json:"currency"`
		}
		if err := json.Unmarshal([]byte(job.Payload()), &payload); err != nil || payload.PaymentID == "" {
			_, werr := job.Fail(ctx, jobfence.ManualReview, fmt.Sprintf("bad refund payload: %v", err), 0)
			return werr
		}
		if job.Reconcile() {
			return reconcile(ctx, p, job)
		}
		refund, err := p.Create(ctx, job.OperationKey(), map[string]interface{}{
			"payment_id": payload.PaymentID, "amount": payload.Amount, "currency": payload.Currency,
			"merchant_reference": job.OperationKey(),
		})
		var t *throttled
		switch {
		case errors.As(err, &t):
			return write(job.FailThrottled(ctx, jobfence.RetryExecute, "provider rate limit (429) on the send: nothing was done", t.retryAfter, t.retryAfter))
		case errors.Is(err, errUnknown):
			return write(job.Fail(ctx, jobfence.RetryReconcile, "outcome unknown, reconcile: "+err.Error(), time.Second))
		case errors.Is(err, errNothingDone):
			return write(job.Fail(ctx, jobfence.RetryExecute, err.Error(), 500*time.Millisecond))
		case err != nil:
			return write(job.Fail(ctx, jobfence.ManualReview, err.Error(), 0))
		}
		return settled(ctx, job, refund)
	}
}

func reconcile(ctx context.Context, p *Provider, job *jobfence.ClaimedJob) error {
	found, err := p.Find(ctx, job.OperationKey())
	var t *throttled
	switch {
	case errors.As(err, &t):
		return write(job.FailThrottled(ctx, jobfence.RetryReconcile, "provider rate limit (429) on the lookup: nothing was done", t.retryAfter, t.retryAfter))
	case err != nil:
		return write(job.Fail(ctx, jobfence.RetryReconcile, "lookup failed: "+err.Error(), time.Second))
	}
	for _, r := range found {
		if r.Status == "succeeded" {
			return settled(ctx, job, r)
		}
	}
	for _, r := range found {
		if r.Status == "pending" {
			return write(job.Fail(ctx, jobfence.RetryReconcile, "refund pending", time.Second))
		}
	}
	if len(found) > 0 {
		return write(job.Fail(ctx, jobfence.Failed, "the provider failed the refund", 0))
	}
	return write(job.Fail(ctx, jobfence.RetryExecute, "not found at the provider; resend with the same idempotency key", 500*time.Millisecond))
}

func settled(ctx context.Context, job *jobfence.ClaimedJob, r Refund) error {
	switch r.Status {
	case "succeeded":
		body, _ := json.Marshal(r)
		_, err := job.Complete(ctx, r.ID, string(body))
		return stale(err)
	case "pending":
		return write(job.Fail(ctx, jobfence.RetryReconcile, "refund "+r.ID+" pending", time.Second))
	default:
		return write(job.Fail(ctx, jobfence.Failed, "the provider failed refund "+r.ID, 0))
	}
}

// write drops the outcome of a write, keeping its error (a refusal for a
// stale attempt is not the handler's failure).
func write(_ jobfence.FailWritten, err error) error { return stale(err) }

func stale(err error) error {
	if errors.Is(err, jobfence.ErrNotHolder) {
		return nil
	}
	return err
}
