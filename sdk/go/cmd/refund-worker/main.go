// Command refund-worker is the Go refund worker:
//
//	refund-worker -coordinator 127.0.0.1:50051 -provider http://127.0.0.1:8099/ -worker-id go-1 -queue refunds
//
// TLS and the bearer token come from the JOBFENCE_* variables. It stops on
// SIGTERM or SIGINT after the jobs in hand are written back. Each log line
// starts with its UTC time in RFC 3339, as the other workers' do (the
// demo's report counts the calls that failed after the client's retries
// by the time of their lines).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	jobfence "github.com/jobfence/jobfence/sdk/go"
	pb "github.com/jobfence/jobfence/sdk/go/jobfencepb"
	"github.com/jobfence/jobfence/sdk/go/refund"
)

func main() {
	coordinator := flag.String("coordinator", "127.0.0.1:50051", "host:port of the coordinator (or its load balancer)")
	provider := flag.String("provider", "http://127.0.0.1:8099/", "the payment provider's base URL")
	workerID := flag.String("worker-id", "go-worker", "this worker's name (informational)")
	queue := flag.String("queue", "refunds", "the queue to claim from")
	lease := flag.Duration("lease", 30*time.Second, "lease asked for on every claim")
	concurrency := flag.Int("concurrency", 8, "jobs handled at once")
	providerTimeout := flag.Duration("provider-timeout", 2*time.Second, "timeout of one provider request")
	flag.Parse()
	log.SetFlags(0)
	log.SetOutput(stamped{os.Stderr})

	creds, err := jobfence.CredentialsFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	client, err := jobfence.Dial(ctx, jobfence.Config{
		Target: *coordinator, WorkerID: *workerID, Queue: *queue, Lease: *lease, Credentials: creds,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	log.Printf("go refund worker %s started on %s", *workerID, *coordinator)
	handle := refund.Handler(refund.NewProvider(*provider, *providerTimeout))
	err = client.Run(ctx, func(ctx context.Context, job *jobfence.ClaimedJob) error {
		err := handle(ctx, job)
		if err != nil {
			// The handler's errors are its writes that failed after the
			// client's retries (a refusal for a stale attempt is not one).
			log.Printf("write back failed: job %d attempt %d: %v", job.ID(), job.Attempt(), err)
		} else {
			log.Print(outcome(job))
		}
		return err
	}, jobfence.RunOptions{Concurrency: *concurrency, Wait: 5 * time.Second})
	retries := map[string]uint64{}
	for reason, n := range client.Retries() {
		if reason == "" {
			reason = "transport"
		}
		retries[string(reason)] = n
	}
	log.Printf("stopped (%v); retries by reason: %v", err, retries)
	if err != nil && ctx.Err() == nil {
		os.Exit(1)
	}
}

// outcome is the log line of a job written back, worded as the other
// clients' refund workers word theirs.
func outcome(job *jobfence.ClaimedJob) string {
	j := job.Job
	switch j.GetState() {
	case pb.JobState_JOB_STATE_SUCCEEDED:
		return fmt.Sprintf("job %d attempt %d completed with %s", job.ID(), job.Attempt(), j.GetProviderReference())
	case pb.JobState_JOB_STATE_RUNNING:
		// No write applied: the coordinator said another attempt holds it.
		return fmt.Sprintf("job %d attempt %d: write refused, no longer the holder", job.ID(), job.Attempt())
	default:
		return fmt.Sprintf("job %d attempt %d: %s -> %s", job.ID(), job.Attempt(), j.GetLastError(), j.GetState())
	}
}

// stamped starts every log line with its UTC time in RFC 3339.
type stamped struct{ w io.Writer }

func (s stamped) Write(p []byte) (int, error) {
	line := append([]byte(time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00")+" "), p...)
	if _, err := s.w.Write(line); err != nil {
		return 0, err
	}
	return len(p), nil
}
