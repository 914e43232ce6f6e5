//! The tests that drive the `jobfence` binary and outside programs (the
//! Python, Node and Go clients, promtool, a browser, grpcurl) beside MariaDB,
//! and those that serve the console. One binary: see docs/development.md.

mod bench_smoke;
mod conformance;
mod console_browser;
mod console_security;
mod durability;
mod fake_provider;
mod go_sdk;
mod main_job;
mod outage;
mod polyglot_python;
mod prometheus;
mod provider_console;
mod readme_workers;
mod retention;
mod serve;
mod shards;

use jobfence_console::operator::Identity;
use jobfence_testkit::secure::Secure;

/// A coordinator with TLS and the callers file, its console beside it
/// acting as the operator `alice` ([`Secure::console`]).
pub async fn with_console() -> Secure {
    Secure::with_companion(Box::new(|listener, security, files| {
        let token = std::fs::read_to_string(files.token("alice")).unwrap();
        let identity =
            Identity::for_coordinator(security.auth.clone(), Some(token.trim().to_owned()))
                .unwrap();
        jobfence_console::companion(listener, identity).unwrap()
    }))
    .await
}
