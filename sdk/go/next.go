package jobfence

import (
	"sync/atomic"

	"google.golang.org/grpc/codes"

	pb "github.com/jobfence/jobfence/sdk/go/jobfencepb"
)

// nextAsk is what a handle's Complete and Fail ask for when it is set:
// the worker's next job, claimed in the same call and transaction
// (docs/design.md rule 16). Nothing is asked once stopping says so.
type nextAsk struct {
	req      *pb.NextJobsRequest
	stopping func() bool
}

// newNextAsk asks for one job of the client's queue with its lease, no
// long poll (when nothing is due, the run loop's own Claim waits).
func (c *Client) newNextAsk(stopping func() bool) *nextAsk {
	return &nextAsk{
		req: &pb.NextJobsRequest{
			Queue: c.cfg.Queue, WorkerId: c.cfg.WorkerID, MaxJobs: 1, Lease: dur(c.cfg.Lease),
		},
		stopping: stopping,
	}
}

// AskForNextJob makes the handle's Complete and Fail also claim the
// worker's next job of its queue (the client's queue, lease and worker
// id) in the same call and transaction (docs/design.md rule 16); take it
// with TakeNextJob after the write. Run does this for every job it hands
// to a handler. Each half answers for itself: a write refused as
// superseded still brings its next job (the error is the write's); a
// write whose outcome is unknown brings none, and the client's retry of
// it is answered as a replay, which claims nothing.
func (j *ClaimedJob) AskForNextJob() {
	j.next = j.client.newNextAsk(func() bool { return false })
}

// TakeNextJob is the next job a write-back of this handle brought (asking
// for its own next job the same way), or nil when none came.
func (j *ClaimedJob) TakeNextJob() *ClaimedJob {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.handed) == 0 {
		return nil
	}
	next := j.client.handle(j.handed[0])
	j.handed = j.handed[1:]
	next.next = j.next
	return next
}

// nextRequest is what the next write carries: nil unless asked, or once
// the run loop is stopping.
func (j *ClaimedJob) nextRequest() *pb.NextJobsRequest {
	if j.next == nil || j.next.stopping() {
		return nil
	}
	return j.next.req
}

// answered keeps the next jobs of a write's answer and returns the
// write's refusal, if the fence refused it, as the error the same call
// without a next-job request returns.
func (j *ClaimedJob) answered(next *pb.NextJobs) error {
	if next == nil {
		return nil
	}
	j.mu.Lock()
	j.handed = append(j.handed, next.GetJobs()...)
	j.mu.Unlock()
	r := next.GetWriteRefused()
	if r == nil {
		return nil
	}
	md := map[string]string{}
	for k, v := range r.GetMetadata() {
		md[k] = v
	}
	return &Error{
		Code: codes.Code(r.GetCode()), Reason: Reason(r.GetReason()), Message: r.GetMessage(),
		Metadata: md, Sent: true,
	}
}

// stopFlag says when Run stopped claiming: write-backs then ask for no
// next job.
type stopFlag struct{ stopped atomic.Bool }

func (s *stopFlag) stopping() bool { return s.stopped.Load() }
