//! The alert rules and the dashboard in deploy/, against real Prometheus
//! tools (Debian's `prometheus` package, installed by scripts/prometheus):
//!
//! - `promtool check rules` and `promtool test rules` pass;
//! - a real Prometheus server on loopback scrapes a running `jobfence serve
//!   --metrics-listen` for a few seconds, loads the rules and evaluates them
//!   without error, and every metric name the rules and the dashboard use is
//!   among the series it scraped (a renamed metric would leave an alert that
//!   can never fire, silently).
//!
//! The tools are `$JOBFENCE_PROMETHEUS_DIR/{promtool,prometheus}` (default
//! /usr/bin). Missing tools fail the test; it never skips.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueRequest, FailDisposition, FailRequest,
    ObservationOutcome, ObservationSource, ProviderBudget, PutProviderRequest,
    RecordObservationRequest,
};
use kit::TestDb;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_jobfence");
const Q: &str = "refunds";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tool(name: &str) -> PathBuf {
    let dir = std::env::var("JOBFENCE_PROMETHEUS_DIR").unwrap_or_else(|_| "/usr/bin".into());
    let path = Path::new(&dir).join(name);
    assert!(
        path.exists(),
        "{} not found: run scripts/prometheus (apt-get install prometheus), \
         or set JOBFENCE_PROMETHEUS_DIR",
        path.display()
    );
    path
}

/// The address Prometheus bound, from its log (its web listener binds
/// port 0 and logs `msg="Listening on" address=127.0.0.1:PORT`).
async fn listening_on(log: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text
            .lines()
            .filter(|l| l.contains("msg=\"Listening on\""))
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("address="))
            });
        if let Some(addr) = found {
            return addr.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "prometheus did not say where it listens within 30 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The rules in the rules file (recording rules and alerts).
const RULES: usize = 21;

fn rules() -> PathBuf {
    repo().join("deploy/prometheus/jobfence.rules.yml")
}

async fn promtool(args: &[&str]) -> String {
    let out = Command::new(tool("promtool"))
        .args(args)
        .current_dir(repo().join("deploy/prometheus"))
        .output()
        .await
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[tokio::test]
async fn promtool_checks_and_unit_tests_the_rules() {
    let checked = promtool(&["check", "rules", "jobfence.rules.yml"]).await;
    assert!(
        checked.contains(&format!("SUCCESS: {RULES} rules found")),
        "{checked}"
    );
    let tested = promtool(&["test", "rules", "jobfence.rules.test.yml"]).await;
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The expressions of the rules file: each `expr:` value, inline or the
/// indented block under `expr: |`.
fn rule_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(rules()).unwrap();
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((indent, rest)) = line.split_once("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest != "|" {
            out.push(rest.to_owned());
            continue;
        }
        let mut block = String::new();
        while let Some(next) = lines.peek() {
            if next.len() - next.trim_start().len() <= indent.len() {
                break;
            }
            block.push_str(lines.next().unwrap());
            block.push('\n');
        }
        out.push(block);
    }
    out
}

/// The expressions of the dashboard's panels.
fn dashboard_exprs() -> Vec<String> {
    let path = repo().join("deploy/grafana/jobfence.dashboard.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .expect("a target with an expr")
                .to_owned()
        })
        .collect()
}

/// The metric names an expression selects: every `jobfence_…` identifier
/// outside label values, and `up` where it is selected (`up{` or `up `).
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Drop the label values ("…"): they are not names.
    let mut bare = String::new();
    let mut quoted = false;
    for c in expr.chars() {
        if c == '"' {
            quoted = !quoted;
        } else if !quoted {
            bare.push(c);
        }
    }
    let mut names = BTreeSet::new();
    let words = bare.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    for word in words {
        if word.starts_with("jobfence_") {
            names.insert(word.to_owned());
        }
    }
    if bare.contains("up{") || bare.trim_start().starts_with("up ") {
        names.insert("up".to_owned());
    }
    names
}

#[test]
fn metric_names_are_read_from_expressions() {
    let names = metric_names(
        r#"sum by (queue, rpc) (rate(jobfence_a_total{x="jobfence_not_a_name"}[5m])) / max by (instance) (jobfence_b) > 0.2 and up{job="j"} == 0"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["jobfence_a_total", "jobfence_b", "up"]
    );
    let rules = rule_exprs();
    assert_eq!(rules.len(), RULES, "{rules:?}");
}

async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    http.get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

/// Calls that make the coordinator count every kind of event the rules
/// watch: hand-outs (execute and reconcile) of a queue with a provider (so
/// the provider's series exist), a takeover, a stale write, an empty
/// claim, a job parked in manual review, an observation.
async fn traffic(addr: &str, db: &TestDb) {
    JobAdminClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .put_provider(PutProviderRequest {
            name: "psp".into(),
            budget: Some(ProviderBudget {
                rate_per_second: 1000.0,
                burst: 1000,
                ..ProviderBudget::default()
            }),
            queues: vec![Q.into()],
            operator: "prometheus-test".into(),
            reason: "the provider series exist".into(),
        })
        .await
        .unwrap();
    // The provider's settlement settings: its settlement series exist.
    JobAdminClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .put_settlement_settings(jobfence_api::v1::PutSettlementSettingsRequest {
            provider: "psp".into(),
            preset: "fake".into(),
            operator: "prometheus-test".into(),
            reason: "the settlement series exist".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut c = JobCoordinatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let claim = |worker: &str| ClaimRequest {
        queue: Q.into(),
        worker_id: worker.into(),
        max_jobs: 1,
        lease: None,
        wait: None,
    };
    for key in ["refund-a", "refund-b"] {
        c.enqueue(EnqueueRequest {
            queue: Q.into(),
            operation_key: key.into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap();
    }
    let a = c.claim(claim("worker-a")).await.unwrap().into_inner().jobs[0]
        .job
        .clone()
        .unwrap();
    let pool = db.pool();
    sqlx::query(
        "UPDATE jobs SET lease_until = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 SECOND) WHERE id = ?",
    )
    .bind(a.job_id)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let taken = c.claim(claim("worker-b")).await.unwrap().into_inner().jobs[0].clone();
    assert!(taken.takeover);
    let stale = c
        .complete(CompleteRequest {
            job_id: a.job_id,
            attempt: a.attempt,
            provider_reference: "re_late".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
    c.record_observation(RecordObservationRequest {
        job_id: a.job_id,
        attempt: a.attempt,
        source: ObservationSource::Worker as i32,
        outcome: ObservationOutcome::Succeeded as i32,
        provider_reference: "re_late".into(),
        body: String::new(),
        dedup_key: "late".into(),
    })
    .await
    .unwrap();
    let b = c.claim(claim("worker-c")).await.unwrap().into_inner().jobs[0]
        .job
        .clone()
        .unwrap();
    c.fail(FailRequest {
        job_id: b.job_id,
        attempt: b.attempt,
        disposition: FailDisposition::ManualReview as i32,
        error: "needs a human".into(),
        retry_delay: None,
        provider_retry_after: None,
        next: None,
    })
    .await
    .unwrap();
    let empty = c.claim(claim("worker-d")).await.unwrap().into_inner();
    assert!(empty.jobs.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_every_metric_the_rules_and_the_dashboard_use() {
    let mut wanted = BTreeSet::new();
    for expr in rule_exprs().iter().chain(dashboard_exprs().iter()) {
        wanted.extend(metric_names(expr));
    }
    assert!(wanted.contains("jobfence_takeovers_total"), "{wanted:?}");

    let db = TestDb::new().await;
    let mut coordinator = Command::new(BIN)
        .args([
            "serve",
            "--insecure",
            "--database-url",
            &db.url,
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(["--pending-refresh-interval", "1s", "--drain-delay", "0s"])
        .env("JOBFENCE_LOG", "info")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start jobfence serve");
    let log = kit::process::ServeLog::follow(&mut coordinator);
    let (grpc, metrics) = (log.grpc().await.to_string(), log.metrics().await);
    jobfence_tools::procs::wait_coordinator(&grpc, &Default::default())
        .await
        .unwrap();
    traffic(&grpc, &db).await;

    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {}\n\
         scrape_configs:\n  - job_name: jobfence\n    static_configs:\n      - targets: ['{metrics}']\n",
        rules().display()
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let mut prometheus = Command::new(tool("prometheus"))
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg("--web.listen-address=127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("prometheus.log")).unwrap(),
        ))
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    let web = listening_on(&dir.join("prometheus.log")).await;

    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (missing, rules_state) = loop {
        let names: BTreeSet<String> = match http
            .get(format!("http://{web}/api/v1/label/__name__/values"))
            .send()
            .await
        {
            // Starting up, Prometheus answers 503 "Service Unavailable"
            // in plain text: not ready yet, like not listening yet.
            Ok(r) => match r.json::<Value>().await {
                Ok(v) => v["data"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
                Err(_) => BTreeSet::new(),
            },
            Err(_) => BTreeSet::new(), // not listening yet
        };
        let missing: Vec<String> = wanted.difference(&names).cloned().collect();
        let groups = if names.is_empty() {
            Value::Null
        } else {
            get_json(&http, &format!("http://{web}/api/v1/rules")).await["data"]["groups"].clone()
        };
        let rules: Vec<Value> = groups
            .as_array()
            .map(|g| {
                g.iter()
                    .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        let evaluated = rules.len() == RULES
            && rules.iter().all(|r| {
                r["lastEvaluation"]
                    .as_str()
                    .is_some_and(|t| !t.starts_with("0001"))
            });
        if (missing.is_empty() && evaluated) || Instant::now() > deadline {
            break (missing, rules);
        }
        if let Ok(Some(status)) = prometheus.try_wait() {
            panic!(
                "prometheus exited ({status}):\n{}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        missing.is_empty(),
        "metric names used by the rules or the dashboard that the coordinator does not export: {missing:?}"
    );
    assert_eq!(rules_state.len(), RULES, "rules loaded: {rules_state:?}");
    for rule in &rules_state {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    // The target is up: its last scrape succeeded. One scrape slower than
    // its 1 s timeout on a loaded machine marks it down until the next, so
    // the check waits for a good one (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let targets = get_json(&http, &format!("http://{web}/api/v1/targets")).await;
        if targets["data"]["activeTargets"][0]["health"] == "up" {
            break;
        }
        assert!(Instant::now() < deadline, "the target is not up: {targets}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let _ = prometheus.kill().await;
    let _ = coordinator.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}
