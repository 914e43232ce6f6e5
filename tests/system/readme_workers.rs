//! Each client installed the way its users install it, in a clean place,
//! and run against a real coordinator:
//!
//! - Rust: a crate of its own in a temporary directory, made of the
//!   `Cargo.toml` lines and minimal worker of docs/workers.md, builds
//!   against `sdk/rust` alone (`cargo tree` shows no sqlx, nothing of the
//!   coordinator) and works jobs.
//! - Python: a fresh venv, the docs' `pip install` line, the package's
//!   `jobfence-refund-worker` against the fake provider, then the docs'
//!   minimal worker.
//! - Node: `npm ci` from the committed lock file in a copy of the package,
//!   its refund worker against the fake provider, then the docs'
//!   install line and minimal worker in a new project.
//! - Go: `go vet` and `go test` are tests/system/go_sdk.rs; here the
//!   module's `cmd/refund-worker`, built offline (GOPATH mode against
//!   Debian's packages, `sdk/go/tools/go`), against the fake provider, then
//!   the docs' build line and minimal worker in a new directory.
//!
//! The snippets are read from docs/workers.md (`crate::doc_snippet`), so
//! what is printed there is what runs. `/path/to/jobfence` in them stands for this checkout. The minimal
//! workers run against a coordinator with TLS and authentication on (as
//! scripts/serve runs it), with the environment scripts/serve prints.

use jobfence_testkit as kit;

mod packaging;

use jobfence_domain::JobState;
use jobfence_fake_provider::{self as provider, ProviderConfig};
use kit::secure::Secure;
use kit::Harness;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The snippet `name` of the docs ([`crate::doc_snippet`]), with
/// `/path/to/jobfence` replaced by this checkout.
fn snippet(name: &str) -> String {
    crate::doc_snippet(name).replace("/path/to/jobfence", repo().to_str().unwrap())
}

/// A scratch directory under the target dir, emptied first.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a command to completion; panics with its output if it fails.
async fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Waits (bounded) until every job is succeeded with `owner` as its lease
/// owner, i.e. completed by that worker.
async fn until_completed_by(h: &Harness, jobs: &[u64], owner: &str, worker: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut done = true;
        for &id in jobs {
            let row = h.row(id).await;
            done &= row.state == JobState::Succeeded && row.lease_owner.as_deref() == Some(owner);
        }
        if done {
            return;
        }
        if let Ok(Some(status)) = worker.try_wait() {
            panic!("{owner} exited early ({status})");
        }
        assert!(
            Instant::now() < deadline,
            "{owner} did not complete {jobs:?} within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `signal` and waits (bounded) for the worker to exit.
async fn stop(worker: &mut Child, signal: nix::sys::signal::Signal) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(worker.id().expect("still running") as i32);
    nix::sys::signal::kill(pid, signal).unwrap();
    tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the worker stops on the signal")
        .unwrap()
}

/// Refund jobs the fake provider accepts.
async fn refunds(h: &Harness, queue: &str, n: u32) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let payment = format!("pay_{queue}_{i}");
        let payload = format!(r#"{{"payment_id":"{payment}","amount":100,"currency":"TWD"}}"#);
        let key = format!("refund-{payment}-100-TWD");
        ids.push(h.enqueue(queue, &key, &payload).await.job_id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_worker_builds_against_the_sdk_crate_alone() {
    let dir = scratch("readme-rust-worker");
    let manifest = format!(
        "[package]\nname = \"minimal-worker\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [workspace]\n\n{}",
        snippet("rust-install")
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let worker = snippet("rust-worker");
    let example =
        std::fs::read_to_string(repo().join("sdk/rust/examples/minimal_worker.rs")).unwrap();
    assert!(
        example.ends_with(&worker),
        "sdk/rust/examples/minimal_worker.rs must end with the worker of docs/workers.md"
    );
    std::fs::write(dir.join("src/main.rs"), worker).unwrap();
    // The workspace's lock: the same versions, so nothing new is fetched.
    std::fs::copy(repo().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    // A target dir of its own, kept between runs: only the first build is slow.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-rust-worker-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let cargo_cmd = |args: &[&str]| {
        let mut c = Command::new(&cargo);
        c.args(args)
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS");
        c
    };
    run(
        "cargo build (the docs' worker)",
        &mut cargo_cmd(&["build", "--offline", "--quiet"]),
    )
    .await;
    let tree = run(
        "cargo tree",
        &mut cargo_cmd(&[
            "tree",
            "--offline",
            "--prefix",
            "none",
            "-e",
            "normal,build",
        ]),
    )
    .await;
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(crates.contains(&"jobfence-worker"), "{tree}");
    assert!(crates.contains(&"tonic"), "{tree}");
    for banned in ["sqlx", "sqlx-core", "sqlx-mysql", "jobfence", "axum"] {
        assert!(
            !crates.contains(&banned),
            "{banned} is in a worker's dependency tree:\n{tree}"
        );
    }

    let h = Harness::start().await;
    let secure = Secure::over(h.db.pool(), false).await;
    let jobs = refunds(&h, "refunds", 3).await;
    let mut worker = Command::new(target.join("debug/minimal-worker"))
        .envs(secure.client_env("refunds-worker"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the docs' Rust worker");
    until_completed_by(&h, &jobs, "rust-minimal-1", &mut worker).await;
    let status = stop(&mut worker, nix::sys::signal::Signal::SIGINT).await;
    assert!(status.success(), "Ctrl-C stops it cleanly: {status}");
    secure.stop().await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_package_installs_in_a_fresh_venv_and_runs_its_refund_worker() {
    let python = std::env::var("JOBFENCE_PYTHON").unwrap_or_else(|_| "python3".into());
    let dir = scratch("readme-python-venv");
    let venv = dir.join("venv");
    run(
        "python -m venv",
        Command::new(&python).args(["-m", "venv"]).arg(&venv),
    )
    .await;
    let bin = venv.join("bin");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The docs' install line, with the venv's pip first on the PATH.
    run(
        "the docs' pip install",
        Command::new("sh")
            .args(["-c", &snippet("python-install")])
            .env("PATH", &path)
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .current_dir(&dir),
    )
    .await;

    let h = Harness::start().await;
    let provider = provider::spawn(ProviderConfig {
        pending_ratio: 0.0,
        ..ProviderConfig::default()
    })
    .await
    .unwrap();
    // The refund worker of the installed package (its console script).
    let jobs = refunds(&h, "py-installed", 3).await;
    let mut worker = Command::new(bin.join("jobfence-refund-worker"))
        .args(["--coordinator", &h.addr.to_string()])
        .args(["--provider", &format!("http://{}/", provider.addr())])
        .args(["--worker-id", "py-installed-1", "--queue", "py-installed"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start jobfence-refund-worker");
    until_completed_by(&h, &jobs, "py-installed-1", &mut worker).await;
    stop(&mut worker, nix::sys::signal::Signal::SIGTERM).await;

    // The docs' minimal worker, on the installed package only.
    run_the_readme_python_worker(&h, &dir, &bin).await;
    h.finish().await;
}

#[tokio::test]
async fn the_python_package_unit_tests_pass() {
    // sdk/python/tests: one exception class per reason of the coordinator, and
    // stubs that match proto/ (grpcio-tools is in .local/venv).
    let python = std::env::var("JOBFENCE_PYTHON").unwrap_or_else(|_| "python3".into());
    run(
        "python -m unittest discover -s sdk/python/tests",
        Command::new(python)
            .args(["-m", "unittest", "discover", "-s", "sdk/python/tests"])
            .env("PYTHONPATH", repo().join("sdk/python/src"))
            .current_dir(repo()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_package_installs_with_npm_ci_and_runs_its_refund_worker() {
    let node = std::env::var("JOBFENCE_NODE").unwrap_or_else(|_| "node".into());
    // The package as `npm pack` ships it (package.json "files": src, proto),
    // with its lock file; `npm ci` installs exactly what the lock says.
    let pkg = scratch("readme-node-package");
    for f in ["package.json", "package-lock.json", "README.md"] {
        std::fs::copy(repo().join("sdk/node").join(f), pkg.join(f)).unwrap();
    }
    copy_dir(&repo().join("sdk/node/src"), &pkg.join("src"));
    copy_dir(&repo().join("proto"), &pkg.join("proto"));
    copy_dir(&repo().join("sdk/node/test"), &pkg.join("test"));
    run(
        "npm ci",
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&pkg),
    )
    .await;
    let npm_test = run(
        "npm test",
        Command::new("npm")
            .args(["test", "--silent"])
            .current_dir(&pkg)
            .env("JOBFENCE_REPO", repo()),
    )
    .await;
    assert!(npm_test.contains("# fail 0"), "{npm_test}");

    let h = Harness::start().await;
    let provider = provider::spawn(ProviderConfig {
        pending_ratio: 0.0,
        ..ProviderConfig::default()
    })
    .await
    .unwrap();
    let jobs = refunds(&h, "node-installed", 3).await;
    let mut worker = Command::new(&node)
        .arg(pkg.join("src/refund_worker.js"))
        .args(["--coordinator", &h.addr.to_string()])
        .args(["--provider", &format!("http://{}/", provider.addr())])
        .args([
            "--worker-id",
            "node-installed-1",
            "--queue",
            "node-installed",
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the Node refund worker");
    until_completed_by(&h, &jobs, "node-installed-1", &mut worker).await;
    let status = stop(&mut worker, nix::sys::signal::Signal::SIGTERM).await;
    assert!(status.success(), "SIGTERM stops it cleanly: {status}");

    // The docs' install line and minimal worker, in a new project.
    let app = scratch("readme-node-app");
    std::fs::write(app.join("package.json"), r#"{"name":"app","private":true}"#).unwrap();
    run(
        "the docs' npm install",
        Command::new("sh")
            .args(["-c", &snippet("node-install")])
            .env("npm_config_audit", "false")
            .env("npm_config_fund", "false")
            .current_dir(&app),
    )
    .await;
    std::fs::write(app.join("worker.js"), snippet("node-worker")).unwrap();
    let secure = Secure::over(h.db.pool(), false).await;
    let jobs = refunds(&h, "refunds", 2).await;
    let mut worker = Command::new(&node)
        .arg("worker.js")
        .envs(secure.client_env("refunds-worker"))
        .current_dir(&app)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the docs' Node worker");
    until_completed_by(&h, &jobs, "node-minimal-1", &mut worker).await;
    let status = stop(&mut worker, nix::sys::signal::Signal::SIGINT).await;
    assert!(status.success(), "Ctrl-C stops it cleanly: {status}");
    secure.stop().await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_client_builds_offline_and_runs_its_refund_worker() {
    let bin = scratch("readme-go-bin");
    let refund_worker = crate::go_sdk::build(
        "github.com/jobfence/jobfence/sdk/go/cmd/refund-worker",
        &bin.join("refund-worker"),
    );
    let h = Harness::start().await;
    let provider = provider::spawn(ProviderConfig {
        pending_ratio: 0.0,
        ..ProviderConfig::default()
    })
    .await
    .unwrap();
    let jobs = refunds(&h, "go-installed", 3).await;
    let mut worker = Command::new(&refund_worker)
        .args(["-coordinator", &h.addr.to_string()])
        .args(["-provider", &format!("http://{}/", provider.addr())])
        .args(["-worker-id", "go-installed-1", "-queue", "go-installed"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the Go refund worker");
    until_completed_by(&h, &jobs, "go-installed-1", &mut worker).await;
    let status = stop(&mut worker, nix::sys::signal::Signal::SIGTERM).await;
    assert!(status.success(), "SIGTERM stops it cleanly: {status}");

    // The docs' build line and minimal worker, in a new directory.
    let app = scratch("readme-go-app");
    std::fs::write(app.join("main.go"), snippet("go-worker")).unwrap();
    run(
        "the docs' go build",
        Command::new("sh")
            .args(["-c", &snippet("go-install")])
            .current_dir(&app),
    )
    .await;
    let secure = Secure::over(h.db.pool(), false).await;
    let jobs = refunds(&h, "refunds", 2).await;
    let mut worker = Command::new(app.join("worker"))
        .envs(secure.client_env("refunds-worker"))
        .current_dir(&app)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the docs' Go worker");
    until_completed_by(&h, &jobs, "go-minimal-1", &mut worker).await;
    let status = stop(&mut worker, nix::sys::signal::Signal::SIGINT).await;
    assert!(status.success(), "Ctrl-C stops it cleanly: {status}");
    secure.stop().await;
    h.finish().await;
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Runs the docs' minimal Python worker (its `python-worker` snippet,
/// written into `dir`) with the venv whose `bin` is given, against a TLS
/// coordinator with tokens over `h`'s database, until it completed two
/// refunds; the installed package only (no PYTHONPATH).
async fn run_the_readme_python_worker(h: &Harness, dir: &std::path::Path, bin: &std::path::Path) {
    std::fs::write(dir.join("worker.py"), snippet("python-worker")).unwrap();
    let secure = Secure::over(h.db.pool(), false).await;
    let jobs = refunds(h, "refunds", 2).await;
    let mut worker = Command::new(bin.join("python"))
        .arg("worker.py")
        .envs(secure.client_env("refunds-worker"))
        .env_remove("PYTHONPATH")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the docs' Python worker");
    let mut stderr = worker.stderr.take().unwrap();
    let said = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });
    until_completed_by(h, &jobs, "python-minimal-1", &mut worker).await;
    // Ctrl-C, as the docs say to stop it: a clean exit, no traceback.
    let status = stop(&mut worker, nix::sys::signal::Signal::SIGINT).await;
    let said = said.await.unwrap();
    assert!(
        status.success() && !said.contains("Traceback"),
        "Ctrl-C stops it cleanly: {status}\n{said}"
    );
    secure.stop().await;
}
