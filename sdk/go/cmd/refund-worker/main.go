// Command refund-worker is the Go refund worker:
//
//	refund-worker -coordinator 127.0.0.1:50051 -provider http://127.0.0.1:8099/ -worker-id go-1 -queue refunds
//
// TLS and the bearer token come from the JOBFENCE_* variables. It stops on
// SIGTERM or SIGINT after the jobs in hand are written back.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	jobfence "github.com/jobfence/jobfence/sdk/go"
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
	log.SetFlags(log.LstdFlags | log.LUTC | log.Lmicroseconds)

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
	log.Printf("go refund worker %s on %s", *workerID, *coordinator)
	err = client.Run(ctx, refund.Handler(refund.NewProvider(*provider, *providerTimeout)),
		jobfence.RunOptions{Concurrency: *concurrency, Wait: 5 * time.Second})
	log.Printf("stopped (%v); retries by reason: %v", err, client.Retries())
	if err != nil && ctx.Err() == nil {
		os.Exit(1)
	}
}
