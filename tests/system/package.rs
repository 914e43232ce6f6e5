//! The package, installed as docs/getting-started.md "Install from the
//! package" says: its two blocks run as printed (the reader's two values
//! set to the test database; `scripts/package` packaging this test build,
//! uncompressed), the unit verified, the unit's `ExecStart` started as the
//! user `jobfence` with the edited example configuration, health SERVING
//! over TLS, and SIGTERM draining with NOT_SERVING visible to a probe.
//!
//! It installs system-wide (dpkg, a system user, /etc/jobfence) and purges
//! the package afterwards, so it is ignored by a plain `cargo test`:
//! `scripts/test` runs it alone, as root, after every other test.

use crate::doc_snippet;
use crate::drain::{build_info, sigterm_and_probe, stopped_cleanly};
use jobfence_testkit::process::ServeLog;
use jobfence_testkit::TestDb;
use std::path::Path;
use std::process::{Command, Stdio};

/// `sudo` for a reader running as root on a machine without it (CI): the
/// blocks call `sudo CMD` and `sudo -u USER CMD`.
const SUDO_AS_ROOT: &str = r#"
if ! command -v sudo >/dev/null; then
  sudo() { if [ "$1" = -u ]; then u=$2; shift 2; runuser -u "$u" -- "$@"; else "$@"; fi; }
fi
"#;

/// Runs a block of the docs with bash, in the repository, stopping at the
/// first failing command.
fn run_block(name: &str, block: &str) {
    let script = format!("set -euo pipefail\n{SUDO_AS_ROOT}\n{block}");
    let status = Command::new("bash")
        .args(["-c", &script])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("JOBFENCE_PACKAGE_BINARY", env!("CARGO_BIN_EXE_jobfence"))
        .env("JOBFENCE_PACKAGE_FAST", "1")
        .env_remove("JOBFENCE_DATABASE_URL")
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the block {name} failed: {status}\n{block}"
    );
}

/// Removes what the package and the blocks leave (the user stays).
fn purge() {
    let _ = Command::new("dpkg")
        .args(["--purge", "jobfence"])
        .stdout(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all("/etc/jobfence");
    let _ = std::fs::remove_dir_all("/var/lib/jobfence");
}

/// The block `package-configure` with its two values (the lines a reader
/// sets) set to `url` (no password) and `password`.
fn configure_block(url: &str, password: &str) -> String {
    let block = doc_snippet("package-configure");
    let mut lines: Vec<String> = block.lines().map(str::to_owned).collect();
    assert!(lines[0].starts_with("db_url=") && lines[1].starts_with("db_password="));
    lines[0] = format!("db_url={url}");
    lines[1] = format!("db_password={password}");
    lines.join("\n") + "\n"
}

/// The user jobfence's id (`-u`) or group id (`-g`).
fn id(which: &str) -> u32 {
    let out = Command::new("id")
        .args([which, "jobfence"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
#[ignore = "installs a package system-wide: scripts/test runs it alone, as root"]
async fn the_package_installs_and_serves_as_getting_started_says() {
    let me = Command::new("id").arg("-u").output().unwrap().stdout;
    assert_eq!(me, b"0\n", "dpkg -i needs root");
    let db = TestDb::new().await;
    purge();
    run_block("package-install", &doc_snippet("package-install"));
    let mut url = url::Url::parse(&db.url).unwrap();
    let password = url.password().unwrap().to_owned();
    url.set_password(None).unwrap();
    run_block(
        "package-configure",
        &configure_block(url.as_str(), &password),
    );

    let unit = std::fs::read_to_string("/lib/systemd/system/jobfence.service").unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit has an ExecStart");
    assert!(unit.contains("User=jobfence") && unit.contains("TimeoutStopSec="));
    // As the unit runs it: the user jobfence, in its state directory.
    // Flags win over the file: a free port each, and a drain long enough
    // to probe.
    let mut words = exec.split_whitespace();
    let mut child = tokio::process::Command::new(words.next().unwrap())
        .args(words)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--drain-delay", "5s"])
        .uid(id("-u"))
        .gid(id("-g"))
        .current_dir("/var/lib/jobfence")
        .env("JOBFENCE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log = ServeLog::follow(&mut child);
    let addrs = [log.grpc().await, log.metrics().await];
    log.wait_for("database health changed").await;
    assert!(log.first_line().contains("jobfence coordinator"));
    assert!(build_info(addrs[1])
        .await
        .contains(env!("CARGO_PKG_VERSION")));
    let ca = std::fs::read(Path::new("/etc/jobfence/dev/ca.pem")).unwrap();
    sigterm_and_probe(&child, &log, addrs, Some(&ca)).await;
    stopped_cleanly(&mut child, addrs).await;
    purge();
}
