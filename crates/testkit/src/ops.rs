//! Helpers for the operator-side tests: a coordinator with its metrics
//! endpoint on, that can be stopped and started again on the same
//! database; the Prometheus scrape through the reference Python parser;
//! clients for JobAdmin and JobEvents.

use crate::harness::TestDb;
use crate::serve::{Serve, Served};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::job_events_client::JobEventsClient;
use jobfence_metrics::Metrics;
use jobfence_server::OpsOptions;
use jobfence_store::{JobStore, PausePoints};
use serde_json::Value;
use sqlx::mysql::MySqlPool;
use std::net::SocketAddr;
use std::time::Duration;
use tonic::transport::Channel;

/// One coordinator process (in-process) over a database it does not own.
pub struct Coord {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub metrics: Metrics,
    pub store: JobStore,
    pub pauses: PausePoints,
    served: Served,
}

impl Coord {
    /// Starts a coordinator on `pool` with the metrics endpoint on an
    /// ephemeral port. The pending-age refresher ticks once at start and
    /// then only hourly: tests refresh explicitly with [`Coord::refresh`].
    pub async fn start(pool: &MySqlPool) -> Coord {
        let served = Serve::over(pool.clone())
            .metrics()
            .ops(OpsOptions {
                pending_refresh_interval: Duration::from_secs(3600),
                events_poll_interval: Duration::from_millis(20),
                ..OpsOptions::default()
            })
            .start()
            .await;
        Coord {
            addr: served.addr,
            metrics_addr: served.metrics_addr.expect("served with /metrics"),
            metrics: served.coordinator.metrics().clone(),
            store: served.coordinator.store().clone(),
            pauses: served.pauses.clone(),
            served,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn worker(&self) -> JobCoordinatorClient<Channel> {
        JobCoordinatorClient::connect(self.url()).await.unwrap()
    }

    pub async fn admin(&self) -> JobAdminClient<Channel> {
        JobAdminClient::connect(self.url()).await.unwrap()
    }

    pub async fn events(&self) -> JobEventsClient<Channel> {
        JobEventsClient::connect(self.url()).await.unwrap()
    }

    /// Recomputes the pending-age gauges now.
    pub async fn refresh(&self) {
        jobfence_core::gauges::refresh_pending(&self.store, &self.metrics)
            .await
            .expect("pending ages refresh");
    }

    /// Graceful stop, as on SIGTERM; waits until the server has stopped.
    pub async fn stop(&mut self) {
        self.served.stop().await;
    }

    /// Scrapes `/metrics` and parses it with the reference Prometheus
    /// text-format parser (the `prometheus-client` Python package).
    pub async fn scrape(&self) -> Samples {
        let url = format!("http://{}/metrics", self.metrics_addr);
        // Blocking, off the runtime thread: the server answering the scrape
        // runs on it.
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(python())
                .arg("-c")
                .arg(SCRAPE_PY)
                .arg(&url)
                .output()
                .expect("run python")
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "scrape failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let parsed: Value = serde_json::from_slice(&out.stdout).expect("scraper prints JSON");
        Samples(parsed)
    }
}

/// The Python with `prometheus-client`: `JOBFENCE_PYTHON` (set by
/// scripts/test), else the project's `.local/venv`.
pub fn python() -> String {
    std::env::var("JOBFENCE_PYTHON").unwrap_or_else(|_| {
        let venv = crate::repo().join(".local/venv/bin/python");
        let venv = venv.to_str().unwrap().to_owned();
        assert!(
            std::path::Path::new(&venv).exists(),
            "no JOBFENCE_PYTHON and no {venv}: run scripts/test, or scripts/python-env (which makes the venv)"
        );
        venv
    })
}

/// Fetches the URL with urllib and parses it with
/// `prometheus_client.parser.text_string_to_metric_families`; prints the
/// families as JSON: name, type, help, samples (name, labels, value).
const SCRAPE_PY: &str = r#"
import json, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
    assert r.status == 200, r.status
    ctype = r.headers.get("Content-Type")
    text = r.read().decode("utf-8")
families = []
for f in text_string_to_metric_families(text):
    families.append({
        "name": f.name, "type": f.type, "help": f.documentation,
        "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples],
    })
print(json.dumps({"content_type": ctype, "families": families}))
"#;

/// Parsed scrape.
pub struct Samples(pub Value);

impl Samples {
    pub fn families(&self) -> &Vec<Value> {
        self.0["families"].as_array().unwrap()
    }

    pub fn content_type(&self) -> String {
        self.0["content_type"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The family (by the parser's name: counters lose `_total`).
    pub fn family(&self, name: &str) -> &Value {
        self.families()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no metric family {name}"))
    }

    /// The value of the one sample `name` whose labels include `labels`;
    /// `None` when no sample matches.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matches: Vec<f64> = self
            .families()
            .iter()
            .flat_map(|f| f["samples"].as_array().unwrap())
            .filter(|s| s["name"] == name)
            .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .map(|s| s["value"].as_f64().unwrap())
            .collect();
        assert!(
            matches.len() <= 1,
            "{name} {labels:?} matches {} samples",
            matches.len()
        );
        matches.first().copied()
    }

    /// Like [`Samples::get`], panicking when absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
    }

    /// Sum of every sample `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.families()
            .iter()
            .flat_map(|f| f["samples"].as_array().unwrap())
            .filter(|s| s["name"] == name)
            .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .map(|s| s["value"].as_f64().unwrap())
            .sum()
    }
}

/// Moves a job's timestamps on the test data (never the DB clock):
/// `column = UTC_TIMESTAMP(6) - secs`.
pub async fn set_age(pool: &MySqlPool, job_id: u64, column: &str, secs: u64) {
    let sql = format!(
        "UPDATE jobs SET {column} = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? SECOND) WHERE id = ?"
    );
    let done = sqlx::query(&sql)
        .bind(secs)
        .bind(job_id)
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(done.rows_affected(), 1);
}

/// A fresh private database and a pool on it.
pub async fn fresh_db() -> (TestDb, MySqlPool) {
    let db = TestDb::new().await;
    let pool = db.pool();
    (db, pool)
}

/// Drops a test database.
pub async fn drop_db(db: TestDb, pool: MySqlPool) {
    pool.close().await;
    let admin = crate::connect_admin().await;
    let _ = sqlx::query(&format!("DROP DATABASE `{}`", db.name))
        .execute(&admin)
        .await;
}
