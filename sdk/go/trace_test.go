package jobfence

import (
	"context"
	"testing"

	pb "github.com/jobfence/jobfence/sdk/go/jobfencepb"
	"google.golang.org/grpc/metadata"
)

// traced is a coordinator that keeps the trace headers of each Complete.
type traced struct {
	fake
	seen chan metadata.MD
}

func (f *traced) Complete(ctx context.Context, r *pb.CompleteRequest) (*pb.CompleteResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.seen <- md
	return f.fake.Complete(ctx, r)
}

func TestWithTraceparentSendsTheCallersTraceContext(t *testing.T) {
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	f := &traced{fake: fake{jobs: []*pb.ClaimedJob{claimed(7, 1), claimed(8, 1)}}, seen: make(chan metadata.MD, 2)}
	c := start(t, f)
	jobs, err := c.Claim(context.Background(), 2, 0)
	if err != nil || len(jobs) != 2 {
		t.Fatalf("claim: %v %v", jobs, err)
	}
	ctx := WithTraceparent(context.Background(), parent, "vendor=v1")
	if _, err := jobs[0].Complete(ctx, "re_1", "{}"); err != nil {
		t.Fatal(err)
	}
	md := <-f.seen
	if got := md.Get("traceparent"); len(got) != 1 || got[0] != parent {
		t.Fatalf("traceparent %v", got)
	}
	if got := md.Get("tracestate"); len(got) != 1 || got[0] != "vendor=v1" {
		t.Fatalf("tracestate %v", got)
	}
	// Outside a trace, or with a malformed one, nothing is sent.
	bad := WithTraceparent(context.Background(), "00-0000-zz-01", "")
	if _, err := jobs[1].Complete(bad, "re_2", "{}"); err != nil {
		t.Fatal(err)
	}
	if got := (<-f.seen).Get("traceparent"); len(got) != 0 {
		t.Fatalf("a malformed traceparent was sent: %v", got)
	}
}
