//! Fault injection: which faults hit one request, drawn from the configured
//! probabilities with a seeded RNG, or named by the `X-Fake-Fault` header.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

/// The request header that names the faults of one request exactly,
/// comma-separated (`cut_response`, `latency,lag`), or `none`. When present,
/// the configured probabilities are ignored for that request.
pub const FAULT_HEADER: &str = "x-fake-fault";

/// Fault probabilities (each 0..=1, applied per request to the `/v1` API)
/// and the durations they use. `GET`/`PUT /_admin/faults` read and replace
/// it; a field missing from a `PUT` body is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Probability that the answer waits `latency_ms` more. The work is done
    /// first, so a client that times out meanwhile does not know the
    /// refund was made.
    pub latency: f64,
    /// Added latency, milliseconds.
    pub latency_ms: u64,
    /// Probability that the request is never answered (until the client
    /// gives up); nothing is done.
    pub hang: f64,
    /// Probability that the work is done (a refund is made and recorded),
    /// then the connection is closed without any response.
    pub cut_response: f64,
    /// Probability of a 503 before anything is done.
    pub error_5xx: f64,
    /// Probability that a lookup (`GET /v1/refunds…`) does not see refunds
    /// younger than `lag_ms` (read-after-write lag).
    pub lag: f64,
    /// Read lag, milliseconds.
    pub lag_ms: u64,
}

impl FaultConfig {
    /// Checks that every probability is within 0..=1.
    pub fn validate(&self) -> Result<(), String> {
        for (name, p) in [
            ("latency", self.latency),
            ("hang", self.hang),
            ("cut_response", self.cut_response),
            ("error_5xx", self.error_5xx),
            ("lag", self.lag),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} must be a probability in 0..=1, got {p}"));
            }
        }
        Ok(())
    }
}

/// One kind of fault, as named in `X-Fake-Fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// Answer late by `latency_ms`.
    Latency,
    /// Never answer; do nothing.
    Hang,
    /// Do the work, then close the connection without a response.
    CutResponse,
    /// 503 before doing anything.
    Error5xx,
    /// Lookups miss refunds younger than `lag_ms`.
    Lag,
}

impl FaultKind {
    /// Every kind, in the order a request meets them.
    pub const ALL: [FaultKind; 5] = [
        FaultKind::Error5xx,
        FaultKind::Hang,
        FaultKind::CutResponse,
        FaultKind::Latency,
        FaultKind::Lag,
    ];

    /// The name used in the header and in [`FaultConfig`].
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Latency => "latency",
            FaultKind::Hang => "hang",
            FaultKind::CutResponse => "cut_response",
            FaultKind::Error5xx => "error_5xx",
            FaultKind::Lag => "lag",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown fault {s:?}"))
    }
}

/// The faults one request gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// 503 before doing anything.
    pub error_5xx: bool,
    /// Never answer.
    pub hang: bool,
    /// Close the connection after doing the work.
    pub cut_response: bool,
    /// Extra wait before answering.
    pub latency: Option<Duration>,
    /// Hide refunds younger than this from lookups.
    pub lag: Option<Duration>,
}

impl Faults {
    fn from_kinds(kinds: &[FaultKind], config: &FaultConfig) -> Self {
        let mut f = Faults::default();
        for kind in kinds {
            f.set(*kind, config);
        }
        f
    }

    fn set(&mut self, kind: FaultKind, config: &FaultConfig) {
        match kind {
            FaultKind::Error5xx => self.error_5xx = true,
            FaultKind::Hang => self.hang = true,
            FaultKind::CutResponse => self.cut_response = true,
            FaultKind::Latency => self.latency = Some(Duration::from_millis(config.latency_ms)),
            FaultKind::Lag => self.lag = Some(Duration::from_millis(config.lag_ms)),
        }
    }
}

/// Parses an `X-Fake-Fault` value: `none`, or kinds separated by commas.
pub fn parse_fault_header(value: &str) -> Result<Vec<FaultKind>, String> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    value.split(',').map(|k| k.trim().parse()).collect()
}

/// Decides the faults of each request. Shared by all connections.
#[derive(Debug)]
pub struct FaultInjector {
    config: Mutex<FaultConfig>,
    rng: Mutex<fastrand::Rng>,
}

impl FaultInjector {
    /// An injector with `config`, drawing from an RNG seeded with `seed`
    /// (or a random seed).
    pub fn new(config: FaultConfig, seed: Option<u64>) -> Self {
        let rng = seed.map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        FaultInjector {
            config: Mutex::new(config),
            rng: Mutex::new(rng),
        }
    }

    /// The current configuration.
    pub fn config(&self) -> FaultConfig {
        *self.config.lock().expect("fault config lock poisoned")
    }

    /// Replaces the configuration (after [`FaultConfig::validate`]).
    pub fn set_config(&self, config: FaultConfig) -> Result<(), String> {
        config.validate()?;
        *self.config.lock().expect("fault config lock poisoned") = config;
        Ok(())
    }

    /// The faults for one request: exactly `forced` if the request named
    /// them, else one draw per kind against the configured probabilities.
    ///
    /// Every request draws the same number of times whatever the
    /// configuration, so with a fixed seed and sequential requests the
    /// sequence of faults is reproducible.
    pub fn decide(&self, forced: Option<&[FaultKind]>) -> Faults {
        let config = self.config();
        if let Some(kinds) = forced {
            return Faults::from_kinds(kinds, &config);
        }
        let mut rng = self.rng.lock().expect("fault rng lock poisoned");
        let mut faults = Faults::default();
        for kind in FaultKind::ALL {
            let p = match kind {
                FaultKind::Error5xx => config.error_5xx,
                FaultKind::Hang => config.hang,
                FaultKind::CutResponse => config.cut_response,
                FaultKind::Latency => config.latency,
                FaultKind::Lag => config.lag,
            };
            if rng.f64() < p {
                faults.set(kind, &config);
            }
        }
        faults
    }
}
