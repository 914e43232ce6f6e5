//! The on-call path of docs/operating.md ("Operator commands"), as printed: enqueue, look (stats, workers),
//! pause the queue, repair in bulk (dry run, then cancel), list, resume:
//! every step a `jobfence` command, no grpcurl, against the binary run as
//! scripts/serve runs it (TLS and authentication on, the throw-away
//! credentials of `jobfence credentials dev` in `.local/serve` of a
//! scratch directory). Only the binary's path and the address are
//! replaced; the script stops at the first command that fails. Then a
//! command whose reader closed the pipe, and one that cannot reach its
//! coordinator: the exit statuses scripts read.

use jobfence_testkit as kit;

use kit::TestDb;

#[tokio::test]
async fn the_readmes_on_call_commands_work_as_printed() {
    let db = TestDb::new().await;
    let bin = env!("CARGO_BIN_EXE_jobfence");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-oncall");
    let (_server, addr) = crate::as_scripts_serve_runs_it(&db, &dir).await;

    let printed = crate::doc_snippet("oncall");
    let script = printed
        .replace("target/release/jobfence", bin)
        .replace("127.0.0.1:50051", &addr);
    assert!(script.contains(bin) && script.contains(&addr), "{printed}");
    let out = tokio::process::Command::new("bash")
        .args(["-e", "-c", &script])
        .current_dir(&dir)
        .env_remove("JOBFENCE_COORDINATOR")
        .env_remove("JOBFENCE_ENDPOINT")
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the on-call commands failed:\n{text}");
    for expected in [
        "enqueued job 1 in queue refunds (key refund-pay_7-900-TWD), ready",
        "no worker called any coordinator in the last 15m",
        "queue refunds paused",
        "refunds: 1 ready held: queue refunds paused: INC-7: provider answers 5xx (by operator since",
        "1 job selected (dry run: nothing changed)",
        "1 selected: 1 applied, 0 skipped",
        "cancelled by operator: INC-7: withdrawn by the customer",
        "queue refunds resumed",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }
    // What the commands said, in the database: the job cancelled once.
    let state: String = sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM jobs WHERE id = 1")
        .fetch_one(&db.pool())
        .await
        .unwrap();
    assert_eq!(state, "cancelled");

    // A reader that closed the pipe (`jobfence stats | head`) before the
    // command wrote: no message, and 141, the status of a filter ended by
    // SIGPIPE; never 0, which would hide the 1 of a failing command.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = std::process::Command::new(bin)
        .args(["stats", "--token-file", ".local/serve/tokens/operator"])
        .env("JOBFENCE_COORDINATOR", format!("https://{addr}"))
        .env("JOBFENCE_TLS_CA", ".local/serve/ca.pem")
        .env_remove("JOBFENCE_ENDPOINT")
        .current_dir(&dir)
        .stdout(std::process::Stdio::from(write))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert_eq!(stderr, "", "a closed pipe is no error to print");

    // A new terminal without the on-call exports: a cleartext call to the
    // coordinator serving TLS is told what to give.
    let out = std::process::Command::new(bin)
        .args(["stats", "--endpoint", &format!("http://{addr}")])
        .args(["--token-file", ".local/serve/tokens/operator"])
        .env_remove("JOBFENCE_COORDINATOR")
        .env_remove("JOBFENCE_ENDPOINT")
        .env_remove("JOBFENCE_TLS_CA")
        .current_dir(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("a coordinator with TLS needs --tls-ca"),
        "{stderr}"
    );
}

/// The binary's exit status is what cron reads: `settlement report` that
/// cannot reach its coordinator exits 2, not the 1 of a critical exception
/// (tests/in_process/settlement_cli.rs has the 1 and the 0).
#[tokio::test]
async fn settlement_report_exits_2_when_it_cannot_reach_the_coordinator() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobfence"))
        .args(["settlement", "report", "--endpoint", "http://127.0.0.1:1"])
        .env_remove("JOBFENCE_COORDINATOR")
        .env_remove("JOBFENCE_ENDPOINT")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("jobfence: no settlement report: "),
        "{stderr}"
    );
}
