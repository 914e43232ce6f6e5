//! Riding through a database outage, per client (issue 20): the
//! coordinator reaches MariaDB through a relay the test cuts for
//! [`OUTAGE`] (connections closed, new ones refused: as the demo's
//! `database_outage` does), once while a Claim is under way and once while
//! a Complete is. Each client's agent (the conformance agents,
//! `tests/conformance/`) must come out of both with its answer, not an
//! error: the coordinator said `DATABASE_UNAVAILABLE` (nothing applied) and
//! the client retried within its default budget (30 s). Each job is
//! claimed once (attempt 1), completed once, and ends succeeded; the
//! client's retry counter shows that the outage was felt.
//!
//! The 10 s cut is the requirement itself (the issue: "a 10-second
//! database outage"), not a wait for something to happen; nothing here
//! bounds how long a call took.

use crate::conformance::{Agent, Client};
use jobfence_domain::JobState;
use jobfence_testkit as kit;
use kit::Harness;
use std::time::Duration;

/// How long the database stays cut off.
const OUTAGE: Duration = Duration::from_secs(10);

async fn rides_through_a_database_outage(client: Client) {
    let (h, database) = Harness::start_behind_proxy(kit::test_options()).await;
    let queue = "outage";
    let first = h.enqueue(queue, "refund-outage-1", "{}").await.job_id;
    let second = h.enqueue(queue, "refund-outage-2", "{}").await.job_id;
    let mut agent = Agent::start(client, &h.addr.to_string(), queue);
    let name = agent.name.clone();

    // A Claim sent while the database is unreachable.
    database.cut();
    agent.send("claim");
    tokio::time::sleep(OUTAGE).await;
    database.restore();
    assert_eq!(
        agent.reply("claim through the outage").await,
        format!("claimed 0 {first} 1 execute 0 0"),
        "{name}: a claim during a {OUTAGE:?} database outage must be retried, not fail"
    );

    // A Complete sent while the database is unreachable.
    database.cut();
    agent.send("complete 0 re_outage_1");
    tokio::time::sleep(OUTAGE).await;
    database.restore();
    assert_eq!(
        agent.reply("complete through the outage").await,
        "ok replayed=0",
        "{name}: a complete during a {OUTAGE:?} database outage must be retried, not fail"
    );

    // Afterwards, business as usual; nothing was handed out twice.
    for (cmd, want) in [
        (
            "claim".to_owned(),
            format!("claimed 1 {second} 1 execute 0 0"),
        ),
        (
            "complete 1 re_outage_2".to_owned(),
            "ok replayed=0".to_owned(),
        ),
        ("claim".to_owned(), "empty".to_owned()),
    ] {
        agent.send(&cmd);
        assert_eq!(agent.reply(&cmd).await, want, "{name}: {cmd}");
    }
    for job in [first, second] {
        let row = h.row(job).await;
        assert_eq!((row.state, row.attempt), (JobState::Succeeded, 1), "{name}");
        assert_eq!(h.count_events(job, "completed").await, 1, "{name}");
    }
    agent.send("retries");
    let retries = agent.reply("retries").await;
    let n: u64 = retries
        .strip_prefix("retries ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}: {retries}"));
    assert!(n > 0, "{name}: no retry counted, so no outage was felt");
    println!("{name}: {n} retries through two {OUTAGE:?} database outages");
    agent.quit().await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_sdk_rides_through_a_database_outage() {
    rides_through_a_database_outage(Client::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_rides_through_a_database_outage() {
    rides_through_a_database_outage(Client::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_asyncio_client_rides_through_a_database_outage() {
    rides_through_a_database_outage(Client::PythonAsyncio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_client_rides_through_a_database_outage() {
    rides_through_a_database_outage(Client::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_client_rides_through_a_database_outage() {
    rides_through_a_database_outage(Client::Go).await;
}
