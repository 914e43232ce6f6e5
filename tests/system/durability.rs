//! The coordinator says when the database can lose an acknowledged commit
//! (docs/design.md rule 9: a lost claim lets the next claim hand out the same
//! attempt twice), run against the real binary and real MariaDB servers: a
//! private one started with `innodb_flush_log_at_trx_commit=2` gets a
//! warning naming the setting, `jobfence_database_durable 0`, and with
//! `--require-durable-database` a refusal; the test database, durable as
//! `scripts/mariadb` starts it, gets neither.

use jobfence_testkit as kit;

use kit::process::{find_bin, free_port, SERVING_METRICS};
use kit::{base_url, TestDb};
use serde_json::Value;
use sqlx::mysql::MySqlPool;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

const BIN: &str = env!("CARGO_BIN_EXE_jobfence");

/// A MariaDB server of this test's own (temporary datadir, loopback port),
/// flushing its redo log once a second. Killed and removed on drop, also
/// when the test panics.
struct PrivateMariadb {
    server: std::process::Child,
    dir: PathBuf,
    port: u16,
}

impl PrivateMariadb {
    async fn start() -> PrivateMariadb {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("durability-mariadb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let user = String::from_utf8(
            std::process::Command::new("id")
                .arg("-un")
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let user = format!("--user={}", user.trim());
        let datadir = format!("--datadir={}", dir.join("data").display());
        // `normal`: root@127.0.0.1 without a password, so the coordinator
        // connects over TCP like to any server.
        let installed = std::process::Command::new(find_bin("mariadb-install-db"))
            .args(["--no-defaults", &datadir, &user])
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .unwrap();
        assert!(
            installed.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&installed.stderr)
        );
        // A unix socket path must fit in 107 bytes.
        let mut socket = dir.join("mariadbd.sock");
        if socket.as_os_str().len() > 100 {
            socket =
                std::env::temp_dir().join(format!("jf-durability-{}.sock", std::process::id()));
        }
        // mariadbd cannot bind port 0 (`--port=0` is its default port).
        let port = free_port();
        // The flags of scripts/mariadb, but a small buffer pool and the
        // setting under test.
        let server = std::process::Command::new(find_bin("mariadbd"))
            .args(["--no-defaults", &datadir, &user, "--bind-address=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
            .arg(format!("--log-error={}", dir.join("error.log").display()))
            .args([
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--innodb-flush-log-at-trx-commit=2",
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_bin",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let db = PrivateMariadb { server, dir, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while MySqlPool::connect(&db.url()).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the private mariadbd did not start: see {}",
                db.dir.join("error.log").display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        db
    }

    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.port)
    }

    /// `SET GLOBAL innodb_flush_log_at_trx_commit = value`.
    async fn set_flush(&self, value: u8) {
        let pool = MySqlPool::connect(&self.url()).await.unwrap();
        sqlx::query(&format!(
            "SET GLOBAL innodb_flush_log_at_trx_commit = {value}"
        ))
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `jobfence serve` child process with JSON logs on stderr, collected.
struct Served {
    child: tokio::process::Child,
    logs: Arc<Mutex<Vec<Value>>>,
    /// Reads stderr into `logs` until it ends.
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Served {
    /// Listens on port 0; the addresses are in its log.
    fn spawn(database_url: &str, extra: &[&str]) -> Served {
        let mut child = tokio::process::Command::new(BIN)
            .args([
                "--log-format",
                "json",
                "serve",
                "--insecure",
                // A private server's fresh database: a coordinator serves
                // only a schema it knows.
                "--migrate",
                "--database-url",
                database_url,
            ])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--health-interval", "100ms", "--drain-delay", "0s"])
            .args(extra)
            .env("JOBFENCE_LOG", "info")
            .env_remove("JOBFENCE_REQUIRE_DURABLE_DATABASE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = logs.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                // main's last word (`jobfence: …`) is not JSON: keep it as text.
                let v = serde_json::from_str(&line).unwrap_or(Value::String(line));
                sink.lock().unwrap().push(v);
            }
        });
        Served {
            child,
            logs,
            reader: Some(reader),
        }
    }

    /// Where it serves `/metrics`, once it said so.
    fn metrics(&self) -> Option<String> {
        let logs = self.logs.lock().unwrap();
        let line = logs.iter().find(|l| message(l) == SERVING_METRICS)?;
        line["fields"]["listen"].as_str().map(String::from)
    }

    /// `jobfence_database_durable` as scraped now (`None`: not there yet).
    async fn durable_gauge(&self) -> Option<i64> {
        let text = reqwest::get(format!("http://{}/metrics", self.metrics()?))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("jobfence_database_durable "))
            .map(|v| v.trim().parse().expect("an integer gauge"))
    }

    /// Panics, with the logs, if the server exited.
    fn still_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the server exited ({status}); logs:\n{}", self.dump());
        }
    }

    async fn wait_gauge(&mut self, want: i64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = self.durable_gauge().await;
            if got == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "jobfence_database_durable is {got:?}, not {want}; logs:\n{}",
                self.dump()
            );
            self.still_running();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The log lines (JSON) that `pred` accepts, once there are `n` of them.
    async fn wait_logs(&mut self, n: usize, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found: Vec<Value> = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .filter(|l| pred(l))
                .cloned()
                .collect();
            if found.len() >= n {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} such log lines, found {}; logs:\n{}",
                found.len(),
                self.dump()
            );
            self.still_running();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn dump(&self) -> String {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits for the exit, then for the last log line: the process may
    /// exit before the reader has taken its final words from the pipe.
    async fn wait_exit(&mut self) -> ExitStatus {
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the server did not exit; logs:\n{}", self.dump()))
            .unwrap();
        if let Some(reader) = self.reader.take() {
            tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("stderr ends once the server exited")
                .unwrap();
        }
        status
    }

    /// SIGTERM, and a clean exit.
    async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.wait_exit().await;
        assert!(status.success(), "{status:?}; logs:\n{}", self.dump());
    }
}

fn message(l: &Value) -> &str {
    l["fields"]["message"].as_str().unwrap_or_default()
}

/// A warning about one durability setting, with `value`.
fn risk_warning(setting: &'static str, value: &'static str) -> impl Fn(&Value) -> bool {
    move |l| {
        l["level"] == "WARN"
            && message(l).contains("can lose an acknowledged commit")
            && l["fields"]["setting"] == setting
            && l["fields"]["value"] == value
    }
}

fn durable_info(l: &Value) -> bool {
    l["level"] == "INFO" && message(l) == "database commits durably"
}

#[tokio::test]
async fn a_database_that_can_lose_a_commit_is_warned_about_gauged_and_with_require_refused() {
    let db = PrivateMariadb::start().await;

    // Warned about, once per setting, with what it risks; the gauge reads 0.
    let mut served = Served::spawn(&db.url(), &[]);
    served.wait_gauge(0).await;
    let warned = served
        .wait_logs(1, risk_warning("innodb_flush_log_at_trx_commit", "2"))
        .await;
    let risk = warned[0]["fields"]["risk"].as_str().unwrap();
    assert!(risk.contains("power loss"), "{risk}");
    // Read again at every check: a change while serving is reported too.
    db.set_flush(1).await;
    served.wait_gauge(1).await;
    served.wait_logs(1, durable_info).await;
    db.set_flush(2).await;
    served.wait_gauge(0).await;
    served
        .wait_logs(2, risk_warning("innodb_flush_log_at_trx_commit", "2"))
        .await;
    served.stop().await;

    // Required: refused before serving anything, non-zero, saying why.
    let mut refused = Served::spawn(&db.url(), &["--require-durable-database"]);
    let status = refused.wait_exit().await;
    assert!(!status.success(), "{status:?}");
    let last = refused.logs.lock().unwrap().last().cloned().unwrap();
    let last = last.as_str().unwrap_or_default();
    assert!(
        last.starts_with("jobfence: refusing to serve (--require-durable-database)")
            && last.contains("innodb_flush_log_at_trx_commit=2: "),
        "{last}"
    );
    assert!(
        !refused
            .logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| message(l).starts_with("serving jobfence.v1")),
        "the gRPC service was served before the refusal:\n{}",
        refused.dump()
    );

    // Required, and the settings turn unsafe while serving: it stops.
    db.set_flush(1).await;
    let mut serving = Served::spawn(&db.url(), &["--require-durable-database"]);
    serving.wait_gauge(1).await;
    db.set_flush(2).await;
    let status = serving.wait_exit().await;
    assert!(!status.success(), "{status:?}");
    assert!(
        serving.dump().contains("refusing to serve"),
        "{}",
        serving.dump()
    );
}

#[tokio::test]
async fn the_durable_test_database_is_served_without_a_warning() {
    let db = TestDb::new().await;
    let admin = MySqlPool::connect(&base_url()).await.unwrap();
    let flush: (u32,) = sqlx::query_as("SELECT @@GLOBAL.innodb_flush_log_at_trx_commit")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(
        flush.0, 1,
        "the test database is not durable: scripts/test (scripts/mariadb start) makes it so"
    );
    let mut served = Served::spawn(&db.url, &["--require-durable-database"]);
    served.wait_gauge(1).await;
    let info = served.wait_logs(1, durable_info).await;
    let settings = info[0]["fields"]["settings"].as_str().unwrap();
    assert!(
        settings.starts_with("innodb_flush_log_at_trx_commit=1"),
        "{settings}"
    );
    served
        .wait_logs(1, |l| message(l) == "database health changed")
        .await;
    let warnings: Vec<Value> = served
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l["level"] == "WARN")
        // Served --insecure: those warnings are about the listener, not
        // the database.
        .filter(|l| l["target"] != "jobfence_server::security")
        // A health check slower than its 100 ms timeout on a loaded
        // machine says so; that is not about durability.
        .filter(|l| message(l) != "database health changed")
        .cloned()
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    served.stop().await;
    let _ = sqlx::query(&format!("DROP DATABASE `{}`", db.name))
        .execute(&admin)
        .await;
}
