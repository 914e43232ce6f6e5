//! The observations flag's backfill (`JobStore::backfill`, the schema
//! transition `observations_flag` of docs/operating.md "Upgrading"), where
//! it meets other transactions: it runs once, under the transition's row
//! lock, whoever else decides to run it at the same moment; and a lock
//! wait behind a job's row (a claim or a write of a coordinator still
//! serving) times out, is rolled back whole, run again and counted, never
//! answered as a failed backfill nor recorded as done while its update
//! was lost.
//!
//! The job is written as a coordinator of 0.1.0 writes it: an observation
//! recorded without setting `jobs.has_observations`.

use jobfence_testkit as kit;

use jobfence_store::fleet::{Backfill, OBSERVATIONS_FLAG};
use jobfence_store::PausePoint;
use kit::{until, Harness};
use std::time::Duration;

const Q: &str = "refunds";

/// A job with an observation and `has_observations = 0` (inserted
/// directly, as a coordinator of 0.1.0 leaves it), with the transition
/// reopened so that its backfill has work: the job's id.
async fn observed_by_an_older_coordinator(h: &Harness) -> u64 {
    let job: u64 = sqlx::query(
        "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, run_at, \
         created_at, updated_at) VALUES (?, 'refund-1', UNHEX(SHA2('refund-1', 256)), '{}', \
         'ready', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .bind(Q)
    .execute(&h.pool)
    .await
    .unwrap()
    .last_insert_id();
    sqlx::query(
        "INSERT INTO job_observations (job_id, attempt, source, outcome, body, dedup_key, \
         recorded_at) VALUES (?, 0, 'webhook', 'succeeded', '{}', 'evt_1', UTC_TIMESTAMP(6))",
    )
    .bind(job)
    .execute(&h.pool)
    .await
    .unwrap();
    assert_eq!(has_observations(h, job).await, 0);
    // A fresh database's transition completed at its migration (no jobs).
    assert!(
        h.coordinator
            .store()
            .reopen_transition(OBSERVATIONS_FLAG)
            .await
            .unwrap(),
        "the transition was complete"
    );
    assert_eq!(transition(h).await, (false, 0));
    job
}

async fn has_observations(h: &Harness, job: u64) -> i64 {
    sqlx::query_scalar("SELECT CAST(has_observations AS SIGNED) FROM jobs WHERE id = ?")
        .bind(job)
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

/// The transition's row: whether it is complete, how many backfills ran.
async fn transition(h: &Harness) -> (bool, i64) {
    let (complete, backfills): (i64, i64) = sqlx::query_as(
        "SELECT CAST(completed_at IS NOT NULL AS SIGNED), CAST(backfills AS SIGNED) \
         FROM schema_transitions WHERE name = ?",
    )
    .bind(OBSERVATIONS_FLAG)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    (complete != 0, backfills)
}

#[tokio::test]
async fn a_backfill_behind_a_held_row_lock_is_run_again_counted_and_done_once() {
    // The store's sessions wait 1 s for a row lock; the holder's (the
    // harness's pool) keep the server's default.
    let h = Harness::start_with_lock_wait(1).await;
    let job = observed_by_an_older_coordinator(&h).await;
    let store = h.coordinator.store().clone();
    let (retried_before, reported_before) = store.conflicts();

    // Another transaction holds the job's row, as a claim would.
    let mut holder = h.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = ? FOR UPDATE")
        .bind(job)
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let backfilling = store.clone();
    let backfill = tokio::spawn(async move {
        backfilling
            .backfill(OBSERVATIONS_FLAG, "test", Duration::ZERO)
            .await
    });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    // Held past the lock wait timeout: the first try is rolled back and
    // run again.
    until(
        "the backfill's lock wait timed out and was run again",
        || store.conflicts().0 > retried_before,
    )
    .await;
    assert!(!backfill.is_finished(), "it waits again, not answered");
    assert_eq!(transition(&h).await, (false, 0), "nothing recorded yet");
    holder.rollback().await.unwrap();

    let changed = backfill.await.unwrap().expect("the backfill, run again");
    assert_eq!(changed, Backfill::Ran(1), "the one job flagged");
    let (retried, reported) = store.conflicts();
    assert!(retried > retried_before, "retried {retried}");
    assert_eq!(reported, reported_before, "no conflict was reported");
    assert_eq!(has_observations(&h, job).await, 1);
    assert_eq!(transition(&h).await, (true, 1), "one backfill recorded");
    let (by, rows): (String, i64) = sqlx::query_as(
        "SELECT CAST(completed_by AS CHAR), CAST(rows_changed AS SIGNED) FROM schema_transitions \
         WHERE name = ?",
    )
    .bind(OBSERVATIONS_FLAG)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!((by.as_str(), rows), ("test", 1));

    // Complete: a second call changes nothing.
    assert_eq!(
        store
            .backfill(OBSERVATIONS_FLAG, "test", Duration::ZERO)
            .await
            .unwrap(),
        Backfill::Complete
    );
    assert_eq!(transition(&h).await, (true, 1));
    h.finish().await;
}

#[tokio::test]
async fn two_backfills_at_once_run_the_update_once() {
    let h = Harness::start().await;
    let job = observed_by_an_older_coordinator(&h).await;
    let store = h.coordinator.store().clone();
    let retried_before = store.conflicts().0;

    // The first holds the transition's row lock, before its update.
    let mut gate = h.pauses.arm(PausePoint::BackfillBeforeWrite);
    let a = store.clone();
    let first = tokio::spawn(async move {
        a.backfill(OBSERVATIONS_FLAG, "coordinator-a", Duration::ZERO)
            .await
    });
    gate.reached().await;
    // The second waits for that lock.
    let b = store.clone();
    let second = tokio::spawn(async move {
        b.backfill(OBSERVATIONS_FLAG, "coordinator-b", Duration::ZERO)
            .await
    });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    assert_eq!(transition(&h).await, (false, 0));
    gate.release();

    let first = first.await.unwrap().expect("the first backfill");
    let second = second.await.unwrap().expect("the second backfill");
    assert_eq!(
        (first, second),
        (Backfill::Ran(1), Backfill::Complete),
        "the first flags the job, the second finds the transition complete"
    );
    assert_eq!(has_observations(&h, job).await, 1);
    assert_eq!(transition(&h).await, (true, 1), "one backfill recorded");
    assert_eq!(store.conflicts().0, retried_before, "neither was run again");
    let by: String = sqlx::query_scalar(
        "SELECT CAST(completed_by AS CHAR) FROM schema_transitions WHERE name = ?",
    )
    .bind(OBSERVATIONS_FLAG)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(by, "coordinator-a");
    h.finish().await;
}

/// The quiet period is the database's: a backfill does not run while the
/// transition was reopened (an older coordinator seen, by any coordinator)
/// less than the quiet period ago, and runs once it has passed.
#[tokio::test]
async fn a_backfill_waits_for_the_quiet_period_since_the_last_sighting() {
    let h = Harness::start().await;
    let job = observed_by_an_older_coordinator(&h).await;
    let store = h.coordinator.store();
    let quiet = Duration::from_secs(3600);
    assert_eq!(
        store.backfill(OBSERVATIONS_FLAG, "t", quiet).await.unwrap(),
        Backfill::NotQuietYet
    );
    assert_eq!(has_observations(&h, job).await, 0, "nothing changed");
    sqlx::query(
        "UPDATE schema_transitions SET opened_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR \
         WHERE name = ?",
    )
    .bind(OBSERVATIONS_FLAG)
    .execute(&h.pool)
    .await
    .unwrap();
    assert_eq!(
        store.backfill(OBSERVATIONS_FLAG, "t", quiet).await.unwrap(),
        Backfill::Ran(1)
    );
    // Seen again: reopened, and its quiet period starts over.
    assert!(store.reopen_transition(OBSERVATIONS_FLAG).await.unwrap());
    assert_eq!(
        store.backfill(OBSERVATIONS_FLAG, "t", quiet).await.unwrap(),
        Backfill::NotQuietYet
    );
    h.finish().await;
}

/// The fleet check of docs/operating.md "Upgrading": a session of the
/// coordinators' user that no jobfence process registered (a coordinator
/// of 0.1.0 writes no heartbeat and registers nothing) is seen, named by
/// its connection id; this process's own sessions never are, once the
/// registrar has written them; a closed one is gone at the next check.
#[tokio::test]
async fn an_unregistered_session_is_seen_and_this_process_sessions_are_not() {
    use sqlx::Connection;
    let h = Harness::start().await;
    let store = h.coordinator.store();
    let beat = jobfence_store::fleet::Heartbeat {
        name: "fleet-test".into(),
        release: jobfence_store::schema::RELEASE.into(),
        schema_version: jobfence_store::schema::schema_version(),
        host: "test".into(),
        up: std::time::Duration::from_secs(1),
    };
    let quiet = std::time::Duration::from_secs(60);
    // A plain connection, as the previous release opens them.
    let mut old = sqlx::MySqlConnection::connect(&h.db.url).await.unwrap();
    let old_id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut old)
        .await
        .unwrap();
    let view = store.fleet_check(&beat, quiet).await.unwrap();
    let seen: Vec<u64> = view.unregistered.iter().map(|u| u.connection_id).collect();
    assert_eq!(seen, vec![old_id as u64], "only the plain session");
    assert!(view.coordinators.iter().any(|c| c.name == "fleet-test"));
    // The registrar writes this process's sessions within a second or so.
    poll("the registrar wrote this process's sessions", || async {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM coordinator_sessions")
            .fetch_one(&h.pool)
            .await
            .unwrap();
        n > 0
    })
    .await;
    old.close().await.unwrap();
    poll("the closed session is gone", || async {
        store
            .fleet_check(&beat, quiet)
            .await
            .unwrap()
            .unregistered
            .is_empty()
    })
    .await;
}

/// Polls `ready` every 50 ms for up to 10 s.
async fn poll<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ready().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
