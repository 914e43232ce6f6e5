//! `jobfence fake-provider`: flags and the run loop.

use super::{serve, Clock, FaultConfig, ProviderConfig, RateLimitConfig};
use anyhow::Context;
use clap::Args;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

/// Flags of `jobfence fake-provider`. Probabilities are 0..=1, per request;
/// durations are humantime (`250ms`, `2s`, `24h`).
#[derive(Debug, Args)]
pub struct FakeProviderArgs {
    /// Address to listen on; port 0 picks a free one. The bound address is
    /// printed on stdout as `listening on ADDR`.
    #[arg(
        long,
        env = "JOBFENCE_PROVIDER_LISTEN",
        default_value = "127.0.0.1:8099"
    )]
    pub listen: SocketAddr,
    /// How long an idempotency key is remembered, from its first use;
    /// after it, the same key makes a new refund.
    #[arg(long, env = "JOBFENCE_PROVIDER_IDEMPOTENCY_RETENTION", value_parser = humantime::parse_duration, default_value = "24h")]
    pub idempotency_retention: Duration,
    /// Share of new refunds that stay `pending` for --pending-for.
    #[arg(long, env = "JOBFENCE_PROVIDER_PENDING_RATIO", value_parser = parse_probability, default_value_t = 0.0)]
    pub pending_ratio: f64,
    /// How long a pending refund stays pending.
    #[arg(long, env = "JOBFENCE_PROVIDER_PENDING_FOR", value_parser = humantime::parse_duration, default_value = "2s")]
    pub pending_for: Duration,
    /// Seed of the RNGs (faults, pending draw, refund ids), for
    /// reproducible runs; random if unset.
    #[arg(long, env = "JOBFENCE_PROVIDER_SEED")]
    pub seed: Option<u64>,
    /// Probability that an answer is delayed by --latency (after the work).
    #[arg(long, env = "JOBFENCE_PROVIDER_FAULT_LATENCY", value_parser = parse_probability, default_value_t = 0.0)]
    pub fault_latency: f64,
    /// Delay added by the latency fault.
    #[arg(long, env = "JOBFENCE_PROVIDER_LATENCY", value_parser = humantime::parse_duration, default_value = "5s")]
    pub latency: Duration,
    /// Probability that a request is never answered (nothing done).
    #[arg(long, env = "JOBFENCE_PROVIDER_FAULT_HANG", value_parser = parse_probability, default_value_t = 0.0)]
    pub fault_hang: f64,
    /// Probability that the work is done, then the connection is closed
    /// without a response.
    #[arg(long, env = "JOBFENCE_PROVIDER_FAULT_CUT_RESPONSE", value_parser = parse_probability, default_value_t = 0.0)]
    pub fault_cut_response: f64,
    /// Probability of a 503 before anything is done.
    #[arg(long, env = "JOBFENCE_PROVIDER_FAULT_ERROR_5XX", value_parser = parse_probability, default_value_t = 0.0)]
    pub fault_error_5xx: f64,
    /// Probability that a lookup misses refunds younger than --lag.
    #[arg(long, env = "JOBFENCE_PROVIDER_FAULT_LAG", value_parser = parse_probability, default_value_t = 0.0)]
    pub fault_lag: f64,
    /// Read-after-write lag of the lag fault.
    #[arg(long, env = "JOBFENCE_PROVIDER_LAG", value_parser = humantime::parse_duration, default_value = "2s")]
    pub lag: Duration,
    /// Requests per second the /v1 API accepts, creates and lookups
    /// together (fractions allowed); past it, 429 with Retry-After. Off
    /// unless set.
    #[arg(long, env = "JOBFENCE_PROVIDER_RATE_LIMIT")]
    pub rate_limit: Option<f64>,
    /// Requests the rate limit lets through at once after a quiet spell;
    /// default ceil(--rate-limit), at least 1.
    #[arg(
        long,
        env = "JOBFENCE_PROVIDER_RATE_LIMIT_BURST",
        requires = "rate_limit"
    )]
    pub rate_limit_burst: Option<u32>,
}

fn parse_probability(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("expected a probability in 0..=1, got {p}"))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl FakeProviderArgs {
    /// The provider configuration these flags describe.
    pub fn config(&self) -> ProviderConfig {
        ProviderConfig {
            idempotency_retention: self.idempotency_retention,
            pending_ratio: self.pending_ratio,
            pending_for: self.pending_for,
            faults: FaultConfig {
                latency: self.fault_latency,
                latency_ms: millis(self.latency),
                hang: self.fault_hang,
                cut_response: self.fault_cut_response,
                error_5xx: self.fault_error_5xx,
                lag: self.fault_lag,
                lag_ms: millis(self.lag),
            },
            rate_limit: RateLimitConfig {
                rate_per_second: self.rate_limit,
                burst: self.rate_limit_burst,
            },
            seed: self.seed,
            clock: Clock::new(),
        }
    }

    /// Binds, prints `listening on ADDR` on stdout, and serves until
    /// `shutdown` completes.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> anyhow::Result<()> {
        let config = self.config();
        config.validate().map_err(anyhow::Error::msg)?;
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("binding {}", self.listen))?;
        let addr = listener.local_addr()?;
        // A parent process reads this line to learn the port.
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on {addr}")?;
        stdout.flush()?;
        drop(stdout);
        tracing::info!(%addr, ?config, "fake provider serving");
        serve(listener, config, shutdown)
            .await
            .context("serving the fake provider")
    }
}
