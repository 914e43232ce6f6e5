//! Every client refuses a coordinator that names another API major version
//! in its `jobfence-api-version` header (a coordinator served with
//! `advertised_api_version`, what the hidden `serve
//! --advertise-api-version` sets), with its typed error (`api_version` in
//! the agents' words), and works against one of its own major version.

use super::*;
use jobfence_server::OpsOptions;
use kit::Serve;

async fn refuses_another_major_version(client: Client) {
    let h = Harness::start().await;
    let mut v2 = Serve::over(h.pool.clone())
        .ops(OpsOptions {
            advertised_api_version: Some("2.0.0".into()),
            ..OpsOptions::default()
        })
        .start()
        .await;
    let refused = "error api_version recorded=0 current_attempt=0";
    let job = h.enqueue("api-v2", "refund-v2", "{}").await.job_id;
    let mut agent = Agent::start(client, &v2.addr.to_string(), "api-v2");
    let context = format!("{} client against API 2.0.0", agent.name);
    // First a refusal (JOB_NOT_FOUND, an answer without a message: the
    // version comes in its trailers), then answers with a message.
    agent.send("get 1099511627776");
    assert_eq!(agent.reply(&context).await, refused, "{context}: a refusal");
    agent.send("claim");
    assert_eq!(agent.reply(&context).await, refused, "{context}: claim");
    agent.send(&format!("get {job}"));
    assert_eq!(agent.reply(&context).await, refused, "{context}: get");
    agent.send("held");
    assert_eq!(
        agent.reply(&context).await,
        "held 0",
        "{context}: no handle"
    );
    agent.quit().await;
    v2.stop().await;

    // The coordinator of its own major version (API 1.x): served.
    let job = h.enqueue("api-v1", "refund-v1", "{}").await.job_id;
    let mut agent = Agent::start(client, &h.addr.to_string(), "api-v1");
    let context = format!(
        "{} client against API {}",
        agent.name,
        jobfence_api::VERSION
    );
    for (cmd, want) in [
        ("claim".to_owned(), format!("claimed 0 {job} 1 execute 0 0")),
        ("complete 0 re_v1".to_owned(), "ok replayed=0".to_owned()),
        (format!("get {job}"), "job succeeded 1".to_owned()),
    ] {
        agent.send(&cmd);
        assert_eq!(agent.reply(&context).await, want, "{context}: {cmd}");
    }
    agent.quit().await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_sdk_refuses_another_api_major_version() {
    refuses_another_major_version(Client::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_refuses_another_api_major_version() {
    refuses_another_major_version(Client::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_asyncio_client_refuses_another_api_major_version() {
    refuses_another_major_version(Client::PythonAsyncio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_client_refuses_another_api_major_version() {
    refuses_another_major_version(Client::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_client_refuses_another_api_major_version() {
    refuses_another_major_version(Client::Go).await;
}

/// The header is on every answer: a message, and a refusal (which comes
/// trailers-only, its headers its only metadata). The flag that changes
/// it is hidden from `serve --help`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_names_the_api_version_and_the_override_is_hidden() {
    let h = Harness::start().await;
    let answered = h
        .client
        .clone()
        .get_job(jobfence_api::v1::GetJobRequest { job_id: 1 << 40 })
        .await
        .expect_err("no such job");
    assert_eq!(
        answered
            .metadata()
            .get(jobfence_api::VERSION_HEADER)
            .map(|v| v.to_str().unwrap()),
        Some(jobfence_api::VERSION),
        "on a refusal: {answered:?}"
    );
    let job = h.enqueue("api-header", "refund-header", "{}").await.job_id;
    let got = h
        .client
        .clone()
        .get_job(jobfence_api::v1::GetJobRequest { job_id: job })
        .await
        .expect("the job");
    assert_eq!(
        got.metadata()
            .get(jobfence_api::VERSION_HEADER)
            .map(|v| v.to_str().unwrap()),
        Some(jobfence_api::VERSION)
    );
    h.finish().await;

    let help = std::process::Command::new(env!("CARGO_BIN_EXE_jobfence"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--database-url"), "{help}");
    assert!(
        !help.contains("advertise"),
        "the test-only flag is hidden: {help}"
    );
}
