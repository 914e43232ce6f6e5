//! What jobfence's tests share: a private database per test on the real
//! MariaDB, the one builder that serves a coordinator in the test's own
//! process ([`Serve`]), the harnesses built with it, and the levers that
//! make races and lost answers deterministic. Only the tests depend on
//! this crate (it turns on the store's `testsuite` feature, which gives
//! stores pause points).
//!
//! - [`serve`]: [`Serve`] and [`Served`]; [`test_config`] and
//!   [`test_options`].
//! - [`harness`]: [`Harness`] (a coordinator over a fresh database, with a
//!   client), [`serve_in_process`], the database helpers ([`TestDb`]) and
//!   the small ones every suite uses (reasons, waits).
//! - [`ops`]: a coordinator with `/metrics` and the reference Prometheus
//!   parser; [`sdk`]: SDK clients with test timings, a proxy that loses
//!   answers; [`secure`]: a coordinator with TLS and callers.
//! - [`demo`]: a shortened `jobfence demo` and its report.
//! - [`process`]: ports of child processes, read back from their logs.
//! - [`locks`]: waiting until a competing call is blocked on a row lock.
//! - [`otlp`]: a stand-in OpenTelemetry collector keeping the spans sent.
//!
//! The test binaries: `in_process` (this crate's, `tests/in_process/`)
//! needs MariaDB only; `system` and `cluster` (the root package's) also
//! need the `jobfence` binary and outside programs.

pub mod demo;
pub mod harness;
pub mod load;
pub mod locks;
pub mod ops;
pub mod otlp;
pub mod process;
pub mod sdk;
pub mod secure;
pub mod serve;
pub mod settlement;

pub use demo::{numbers, report_line, run_short_demo, run_short_demo_as_is, DemoRun};
pub use harness::*;
pub use locks::until_lock_wait;
pub use serve::{test_config, test_options, Serve, Served};
