//! The workers view across coordinators (docs/operating.md "Workers"):
//! two coordinators over one database each note the workers that call
//! them and write what they saw; ListWorkers on either merges the rows per
//! worker (the coordinator of its latest call, its calls summed) and adds
//! the jobs each holds, live while its lease runs. The write meets a real
//! lock wait and is run again and counted; bad input is refused.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{ClaimRequest, ListWorkersRequest, ListWorkersResponse, Worker};
use jobfence_operator::{Cli, Operation};
use kit::{reason, Harness};
use tonic::Code;

const Q: &str = "refunds";

fn claim(worker: &str) -> ClaimRequest {
    ClaimRequest {
        queue: Q.into(),
        worker_id: worker.into(),
        max_jobs: 1,
        lease: kit::secs(60),
        ..Default::default()
    }
}

async fn list(h: &Harness, req: ListWorkersRequest) -> Result<ListWorkersResponse, tonic::Status> {
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    admin.list_workers(req).await.map(|r| r.into_inner())
}

fn named<'a>(all: &'a ListWorkersResponse, id: &str) -> &'a Worker {
    all.workers
        .iter()
        .find(|w| w.worker_id == id)
        .unwrap_or_else(|| panic!("no {id} in {all:?}"))
}

#[tokio::test]
async fn workers_seen_by_two_coordinators_are_merged_with_the_jobs_they_hold() {
    let h = Harness::start().await;
    let mut other = h.replica(Default::default()).await;
    let job = h.enqueue(Q, "refund-1", "{}").await.job_id;
    // w-a claims the job through the first coordinator, then calls the
    // second (nothing left); w-b calls the second only.
    let got = h.client.clone().claim(claim("w-a")).await.unwrap();
    assert_eq!(got.into_inner().jobs.len(), 1);
    other.client.claim(claim("w-a")).await.unwrap();
    // Its latest call is about another queue: what it holds still shows.
    let payouts = ClaimRequest {
        queue: "payouts".into(),
        ..claim("w-a")
    };
    other.client.claim(payouts).await.unwrap();
    other.client.claim(claim("w-b")).await.unwrap();
    // The Rust SDK names itself in its user-agent.
    let sdk = kit::sdk::sdk(&h, kit::sdk::config("w-sdk", Q)).await;
    assert!(sdk.claim(1).await.unwrap().is_empty());
    assert_eq!(h.coordinator.write_sightings().await.unwrap(), 2);
    assert_eq!(other.coordinator.write_sightings().await.unwrap(), 2);

    let all = list(&h, ListWorkersRequest::default()).await.unwrap();
    let ids: Vec<&str> = all.workers.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(ids, ["w-a", "w-b", "w-sdk"]);
    assert_eq!(
        named(&all, "w-sdk").client,
        jobfence_worker::credentials::USER_AGENT
    );
    assert!(jobfence_worker::credentials::USER_AGENT.starts_with("jobfence-rust/"));
    let a = named(&all, "w-a");
    assert_eq!(
        a.coordinator,
        other.coordinator.config().name,
        "its latest call"
    );
    assert_eq!(
        a.calls_per_minute, 3,
        "one call to the first, two to the other"
    );
    assert_eq!(a.queue, "payouts", "its latest call");
    assert!(a.client.starts_with("tonic/"), "{a:?}");
    assert_eq!(a.held.len(), 1);
    assert_eq!((a.held[0].job_id, a.held[0].attempt), (job, 1));
    assert!(a.held[0].lease_left.unwrap().seconds > 50, "{a:?}");
    assert!(a.live);
    let b = named(&all, "w-b");
    assert_eq!(b.coordinator, other.coordinator.config().name);
    assert!(b.held.is_empty() && b.live);

    // Stale at once: w-b holds nothing; w-a's lease still runs, so it is
    // live whatever its last call.
    let strict = ListWorkersRequest {
        stale_after: kit::secs(0),
        ..Default::default()
    };
    let all = list(&h, strict).await.unwrap();
    assert!(named(&all, "w-a").live);
    assert!(!named(&all, "w-b").live);
    // The gauge counts what the view says (the coordinator sets it after
    // each write).
    h.coordinator.metrics().set_workers(1, 1);
    assert!(h
        .coordinator
        .metrics()
        .render()
        .contains("jobfence_workers{state=\"live\"} 1"));

    // `jobfence workers` prints the same, a line per worker.
    let endpoint = format!("http://{}", h.addr);
    let argv = ["jobfence", "workers", "--endpoint", &endpoint];
    let op = Cli::try_parse_from(argv).unwrap().command;
    assert!(matches!(op, Operation::Workers(_)));
    let mut out = Vec::new();
    jobfence_operator::run(op, &mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    let line = out.lines().find(|l| l.starts_with("w-a ")).expect(&out);
    assert!(
        line.contains("live") && line.contains(&format!("{job}@1")),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("w-b ")), "{out}");
    h.finish().await;
}

#[tokio::test]
async fn listing_workers_refuses_bad_durations_with_field_violations() {
    let h = Harness::start().await;
    let negative = ListWorkersRequest {
        stale_after: Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        }),
        ..Default::default()
    };
    let zero = ListWorkersRequest {
        within: kit::secs(0),
        ..Default::default()
    };
    let forever = ListWorkersRequest {
        within: kit::secs(400 * 24 * 3600),
        ..Default::default()
    };
    for (req, field) in [
        (negative, "stale_after"),
        (zero, "within"),
        (forever, "within"),
    ] {
        let refused = list(&h, req).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(reason(&refused), "INVALID_REQUEST");
        assert!(refused.message().contains(field), "{refused:?}");
    }
    // A Claim refused for its fields leaves no sighting (its row could not
    // be written, and would hold up every other worker's).
    for (queue, worker) in [("bad queue é", "w-x"), (Q, &*"w".repeat(300))] {
        let bad = ClaimRequest {
            queue: queue.into(),
            ..claim(worker)
        };
        let refused = h.client.clone().claim(bad).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    }
    assert_eq!(h.coordinator.write_sightings().await.unwrap(), 0);
    // A worker chooses its id: `jobfence workers` prints its control
    // characters escaped, never into the operator's terminal.
    h.client
        .clone()
        .claim(claim("w-\u{1b}[31mred\n"))
        .await
        .unwrap();
    assert_eq!(h.coordinator.write_sightings().await.unwrap(), 1);
    let endpoint = format!("http://{}", h.addr);
    let op = Cli::try_parse_from(["jobfence", "workers", "--endpoint", &endpoint])
        .unwrap()
        .command;
    let mut out = Vec::new();
    jobfence_operator::run(op, &mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("w-\\u{1b}[31mred\\n"), "{out}");
    assert!(!out.contains('\u{1b}'), "{out}");
    h.finish().await;
}

/// A coordinator's write of its sightings behind another transaction's
/// lock on the row (the default MariaDB, lock waits of 1 s) times out, is
/// run again and counted, and lands once the row is free.
#[tokio::test]
async fn a_sightings_write_behind_a_row_lock_is_run_again_counted_and_applied() {
    let h = Harness::start_with_lock_wait(1).await;
    h.client.clone().claim(claim("w-a")).await.unwrap();
    h.coordinator.write_sightings().await.unwrap();
    h.client.clone().claim(claim("w-a")).await.unwrap();
    let mut holder = h.db.pool().begin().await.unwrap();
    sqlx::query("SELECT worker_id FROM worker_sightings WHERE worker_id = 'w-a' FOR UPDATE")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let store = h.coordinator.store().clone();
    let before = store.conflicts();
    let coordinator = h.coordinator.clone();
    let written = tokio::spawn(async move { coordinator.write_sightings().await });
    kit::until("the write's lock wait timed out and was run again", || {
        store.conflicts().0 > before.0
    })
    .await;
    holder.rollback().await.unwrap();
    assert_eq!(
        written.await.unwrap().expect("applied after its conflict"),
        1
    );
    let (retried, reported) = store.conflicts();
    assert!(retried > before.0, "retried {retried}");
    assert_eq!(reported, before.1, "no conflict reached the caller");
    let calls: u32 = sqlx::query_scalar(
        "SELECT calls_last_minute FROM worker_sightings WHERE worker_id = 'w-a'",
    )
    .fetch_one(&h.db.pool())
    .await
    .unwrap();
    assert_eq!(calls, 2, "the second write's count landed");
    h.finish().await;
}
