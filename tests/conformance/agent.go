// The conformance agent of the Go client (sdk/go; see README.md beside
// it): it reads one command a line on stdin and answers each with one line
// on stdout, using the client's defaults, except that a Claim asks for one
// job without waiting. tests/system/conformance.rs builds it with
// sdk/go/tools/go.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	jobfence "github.com/jobfence/jobfence/sdk/go"
	pb "github.com/jobfence/jobfence/sdk/go/jobfencepb"
)

func kind(err error) string {
	kinds := []struct {
		match error
		name  string
	}{
		{jobfence.ReasonAttemptSuperseded, "superseded"},
		{jobfence.ReasonJobNotRunning, "not_running"},
		{jobfence.ReasonJobNotFound, "not_found"},
		{jobfence.ReasonJobFinished, "finished"},
		{jobfence.ReasonLeaseNotExpired, "lease_not_expired"},
		{jobfence.ReasonInvalidRequest, "invalid"},
		{jobfence.ErrOutcomeUnknown, "outcome_unknown"},
		{jobfence.ErrNothingApplied, "unavailable"},
		{jobfence.ErrDenied, "denied"},
		{jobfence.ErrAPIVersion, "api_version"},
	}
	for _, k := range kinds {
		if errors.Is(err, k.match) {
			return k.name
		}
	}
	return "other"
}

func errorLine(err error) string {
	recorded, current := 0, uint64(0)
	var e *jobfence.Error
	if errors.As(err, &e) {
		if e.ObservationRecorded {
			recorded = 1
		}
		current = e.CurrentAttempt()
	}
	return fmt.Sprintf("error %s recorded=%d current_attempt=%d", kind(err), recorded, current)
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: agent TARGET WORKER_ID QUEUE")
		os.Exit(2)
	}
	creds, err := jobfence.CredentialsFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx := context.Background()
	client, err := jobfence.Dial(ctx, jobfence.Config{
		Target: os.Args[1], WorkerID: os.Args[2], Queue: os.Args[3], Lease: 30 * time.Second,
		Credentials: creds,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	var handles []*jobfence.Job
	claimed := func(job *jobfence.Job) string {
		handles = append(handles, job)
		action, takeover := "execute", 0
		if job.Reconcile() {
			action = "reconcile"
		}
		if job.Takeover {
			takeover = 1
		}
		return fmt.Sprintf("claimed %d %d %d %s %d %d", len(handles)-1, job.ID(), job.Attempt(),
			action, takeover, len(job.Observations))
	}
	dispositions := map[string]jobfence.Disposition{
		"retry_reconcile": jobfence.RetryReconcile, "retry_execute": jobfence.RetryExecute,
		"failed": jobfence.Failed, "manual_review": jobfence.ManualReview,
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		words := strings.Fields(in.Text())
		if len(words) == 0 {
			continue
		}
		if words[0] == "quit" {
			return
		}
		arg := func(i int) uint64 { n, _ := strconv.ParseUint(words[i], 10, 64); return n }
		var reply string
		switch words[0] {
		case "reasons":
			var all []string
			for _, r := range jobfence.Reasons() {
				all = append(all, string(r))
			}
			sort.Strings(all)
			reply = "reasons " + strings.Join(all, " ")
		case "run":
			// The runner with a handler that must not run: only sent when
			// its claims are refused, so Run returns the refusal.
			err := client.Run(ctx, func(_ context.Context, job *jobfence.Job) error {
				return fmt.Errorf("a refused runner got job %d", job.ID())
			}, jobfence.RunOptions{})
			if err != nil {
				reply = errorLine(err)
			} else {
				reply = "run ended"
			}
		case "retries":
			var n uint64
			for _, k := range client.Retries() {
				n += k
			}
			reply = fmt.Sprintf("retries %d", n)
		case "held":
			reply = fmt.Sprintf("held %d", len(handles))
		case "get":
			job, _, err := client.GetJob(ctx, arg(1))
			if err != nil {
				reply = errorLine(err)
			} else {
				state := strings.ToLower(strings.TrimPrefix(job.GetState().String(), "JOB_STATE_"))
				reply = fmt.Sprintf("job %s %d", state, job.GetAttempt())
			}
		case "enqueue":
			reply = enqueue(ctx, client, os.Args[3], words[1:])
		case "fair":
			job := handles[arg(1)]
			reply = fmt.Sprintf("fair priority=%d fairness_key=%s", job.Priority(), job.FairnessKey())
		case "claim":
			jobs, err := client.Claim(ctx, 1, 0)
			switch {
			case err != nil:
				reply = errorLine(err)
			case len(jobs) == 0:
				reply = "empty"
			default:
				reply = claimed(jobs[0])
			}
		case "takeover":
			job, err := client.Takeover(ctx, arg(1))
			if err != nil {
				reply = errorLine(err)
			} else {
				reply = claimed(job)
			}
		case "complete":
			ref := words[2]
			w, err := handles[arg(1)].Complete(ctx, ref, fmt.Sprintf(`{"id":"%s"}`, ref))
			if err != nil {
				reply = errorLine(err)
			} else {
				reply = fmt.Sprintf("ok replayed=%d", b(w.Replayed))
			}
		case "complete-next":
			ref, job := words[2], handles[arg(1)]
			job.AskForNextJob()
			w, err := job.Complete(ctx, ref, fmt.Sprintf(`{"id":"%s"}`, ref))
			if err != nil {
				reply = errorLine(err)
			} else {
				reply = fmt.Sprintf("ok replayed=%d", b(w.Replayed))
			}
			if next := job.TakeNextJob(); next != nil {
				reply += " next " + claimed(next)
			} else {
				reply += " next empty"
			}
		case "fail":
			out, err := handles[arg(1)].Fail(ctx, dispositions[words[2]], "conformance", 0)
			if err != nil {
				reply = errorLine(err)
			} else {
				applied := strings.ToLower(strings.TrimPrefix(pb.FailDisposition(out.Applied).String(), "FAIL_DISPOSITION_"))
				reply = fmt.Sprintf("ok applied=%s replayed=%d", applied, b(out.Replayed))
			}
		default:
			reply = "unknown command " + words[0]
		}
		fmt.Println(reply)
	}
}

// enqueue runs `enqueue KEY FAIRNESS_KEY|- PRIORITY` on the agent's queue
// and answers with what the returned job says.
func enqueue(ctx context.Context, client *jobfence.Client, queue string, args []string) string {
	var opts []jobfence.EnqueueOption
	if args[1] != "-" {
		opts = append(opts, jobfence.WithFairnessKey(args[1]))
	}
	priority, _ := strconv.ParseUint(args[2], 10, 32)
	opts = append(opts, jobfence.WithPriority(uint32(priority)))
	job, created, err := client.Enqueue(ctx, queue, args[0], "{}", 0, opts...)
	if err != nil {
		return errorLine(err)
	}
	return fmt.Sprintf("enqueued %d created=%d priority=%d fairness_key=%s", job.GetJobId(), b(created),
		job.GetPriority(), job.GetFairnessKey())
}

func b(v bool) int {
	if v {
		return 1
	}
	return 0
}
