package jobfence

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Config says how a worker reaches its coordinator and what it asks for.
type Config struct {
	// Target is the coordinator (or its load balancer) as host:port.
	Target string
	// WorkerID is recorded as the lease owner (informational only: the
	// attempt, not the name, decides who may write).
	WorkerID string
	// Queue is the queue this worker claims from.
	Queue string
	// Lease asked for on every Claim and Takeover (DB clock, within the
	// server's bounds). Default 30 s.
	Lease time.Duration
	// CallTimeout is the deadline of one RPC (a long-polling Claim gets
	// its wait on top). Default 10 s.
	CallTimeout time.Duration
	// Retry decides how calls that applied nothing are retried.
	Retry RetryPolicy
	// Credentials: TLS and the bearer token; CredentialsFromEnv reads
	// them from the JOBFENCE_* variables every jobfence client reads.
	Credentials Credentials
}

func (c *Config) defaults() error {
	if c.Target == "" || c.WorkerID == "" || c.Queue == "" {
		return errors.New("jobfence: Config needs Target, WorkerID and Queue")
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 10 * time.Second
	}
	c.Retry = c.Retry.withDefaults()
	return nil
}

// Credentials are the TLS settings and the bearer token of a worker; all
// empty for a coordinator run with --insecure.
type Credentials struct {
	// TLSCAPEM is the CA that signed the coordinator's certificate (PEM);
	// set, the client speaks TLS.
	TLSCAPEM []byte
	// TLSClientCertPEM and TLSClientKeyPEM: a client certificate for
	// mutual TLS (both or neither).
	TLSClientCertPEM, TLSClientKeyPEM []byte
	// Token is sent as "authorization: Bearer <token>" on every call.
	Token string
}

// CredentialsFromEnv reads JOBFENCE_TLS_CA (a PEM file: TLS),
// JOBFENCE_TLS_CLIENT_CERT and JOBFENCE_TLS_CLIENT_KEY (mutual TLS), and
// JOBFENCE_TOKEN_FILE (a file whose first line is the token) or
// JOBFENCE_TOKEN, like the Rust, Python and Node clients.
func CredentialsFromEnv() (Credentials, error) {
	var c Credentials
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("jobfence: reading %s: %w", name, err)
		}
		return b, nil
	}
	var err error
	if ca := os.Getenv("JOBFENCE_TLS_CA"); ca != "" {
		if c.TLSCAPEM, err = read(ca); err != nil {
			return c, err
		}
	}
	cert, key := os.Getenv("JOBFENCE_TLS_CLIENT_CERT"), os.Getenv("JOBFENCE_TLS_CLIENT_KEY")
	if (cert == "") != (key == "") {
		return c, errors.New("jobfence: set both JOBFENCE_TLS_CLIENT_CERT and JOBFENCE_TLS_CLIENT_KEY, or neither")
	}
	if cert != "" {
		if c.TLSClientCertPEM, err = read(cert); err != nil {
			return c, err
		}
		if c.TLSClientKeyPEM, err = read(key); err != nil {
			return c, err
		}
	}
	if f := os.Getenv("JOBFENCE_TOKEN_FILE"); f != "" {
		b, err := read(f)
		if err != nil {
			return c, err
		}
		c.Token = strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
		if c.Token == "" {
			return c, fmt.Errorf("jobfence: the token file %s is empty", f)
		}
	} else {
		c.Token = os.Getenv("JOBFENCE_TOKEN")
	}
	return c, nil
}

// bearer puts the token on every call.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: the token also travels to a
// coordinator behind a TLS-terminating proxy on a private network.
func (b bearer) RequireTransportSecurity() bool { return false }

func (c Credentials) dialOptions() ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if len(c.TLSCAPEM) == 0 {
		if len(c.TLSClientCertPEM) > 0 {
			return nil, errors.New("jobfence: a client certificate needs TLS: set JOBFENCE_TLS_CA too")
		}
		opts = append(opts, grpc.WithInsecure())
	} else {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c.TLSCAPEM) {
			return nil, errors.New("jobfence: the TLS CA holds no PEM certificate")
		}
		cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if len(c.TLSClientCertPEM) > 0 {
			pair, err := tls.X509KeyPair(c.TLSClientCertPEM, c.TLSClientKeyPEM)
			if err != nil {
				return nil, fmt.Errorf("jobfence: the client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(c.Token)))
	}
	return opts, nil
}
