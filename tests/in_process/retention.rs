//! Retention (docs/design.md rule 14, issue 19): finished jobs are pruned with
//! their observations and events; their operation keys are not. A retried
//! Enqueue of a pruned key answers as before, a zombie naming a pruned job
//! is refused and writes nothing, live jobs are never pruned whatever their
//! age, two pruners at once prune each row once, and an events consumer
//! behind the pruned range is refused instead of skipping. "Older than the
//! retention" is set by moving `finished_at` back on the DB clock.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::job_events_client::JobEventsClient;
use jobfence_api::v1::{
    enqueue_batch_result, CompleteRequest, EnqueueBatchRequest, EnqueueRequest, FailDisposition,
    FailRequest, GetJobRequest, JobState, ListEventsRequest, ObservationOutcome, ObservationSource,
    PutQueuePolicyRequest, RecordObservationRequest, RenewLeaseRequest,
};
use jobfence_domain::{PruneCounts, Retention};
use jobfence_store::retention::PruneRun;
use jobfence_store::{JobStore, PausePoint};
use kit::{meta, reason, Harness};
use std::time::Duration;
use tonic::Code;

const Q: &str = "refunds";
const DAY: Duration = Duration::from_secs(86_400);

fn thirty_days() -> Retention {
    Retention {
        jobs: 30 * DAY,
        keys: None,
    }
}

fn req(key: &str, payload: &str) -> EnqueueRequest {
    EnqueueRequest {
        queue: Q.into(),
        operation_key: key.into(),
        payload: payload.into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    }
}

/// Moves a job's `finished_at` (set or not) `days` into the past.
async fn finished_days_ago(h: &Harness, job_id: u64, days: i64) {
    sqlx::query(
        "UPDATE jobs SET finished_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY), \
         created_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY), \
         updated_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY) WHERE id = ?",
    )
    .bind(days)
    .bind(days + 1)
    .bind(days)
    .bind(job_id)
    .execute(&h.pool)
    .await
    .unwrap();
}

/// Enqueues, claims and completes a job with provider reference `re_<key>`.
async fn succeeded(h: &Harness, key: &str, payload: &str) -> u64 {
    let job = h.enqueue(Q, key, payload).await;
    let claimed = h.claim_one(Q, "w").await;
    assert_eq!(claimed.job_id, job.job_id);
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: job.job_id,
            attempt: claimed.attempt,
            provider_reference: format!("re_{key}"),
            result: "{\"status\":\"ok\"}".into(),
            next: None,
        })
        .await
        .unwrap();
    job.job_id
}

async fn prune(store: &JobStore, retention: &Retention) -> PruneCounts {
    match store.prune(retention, 500, |_| {}).await.unwrap() {
        PruneRun::Done(c) => c,
        PruneRun::LockHeld => panic!("the pruner's lock was held"),
    }
}

/// Rows about `job_id` in jobs, job_observations, job_events.
async fn rows_of(h: &Harness, job_id: u64) -> (i64, i64, i64) {
    let count = |sql: &'static str| {
        let pool = h.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(job_id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    (
        count("SELECT COUNT(*) FROM jobs WHERE id = ?").await,
        count("SELECT COUNT(*) FROM job_observations WHERE job_id = ?").await,
        count("SELECT COUNT(*) FROM job_events WHERE job_id = ?").await,
    )
}

async fn total(h: &Harness, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_pruned_key_is_answered_as_before_pruning() {
    let h = Harness::start().await;
    let done = succeeded(&h, "refund-1", "{\"amount\":1}").await;
    let young = succeeded(&h, "refund-2", "{\"amount\":2}").await;
    finished_days_ago(&h, done, 31).await;
    finished_days_ago(&h, young, 29).await;
    let counts = prune(h.coordinator.store(), &thirty_days()).await;
    assert_eq!((counts.jobs, counts.keys_recorded), (1, 1), "{counts:?}");
    assert!(
        counts.events >= 3,
        "enqueued, claimed, completed: {counts:?}"
    );
    assert_eq!(rows_of(&h, done).await, (0, 0, 0));
    assert_eq!(rows_of(&h, young).await.0, 1, "inside its retention");

    // The same request again: the old job, not a new one.
    let again = h
        .client
        .clone()
        .enqueue(req("refund-1", "{\"amount\":1}"))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    let job = again.job.unwrap();
    assert_eq!(job.job_id, done);
    assert_eq!(job.state, JobState::Succeeded as i32);
    assert_eq!(job.provider_reference, "re_refund-1");
    assert_eq!(total(&h, "jobs").await, 1, "no job was created");

    // Another payload under the pruned key: a conflict naming the old job.
    let conflict = h
        .client
        .clone()
        .enqueue(req("refund-1", "{\"amount\":999}"))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    assert_eq!(reason(&conflict), "OPERATION_KEY_CONFLICT");
    assert_eq!(meta(&conflict, "job_id"), done.to_string());

    // A batch, item by item: pruned same, pruned other payload, live, new.
    let results = h
        .client
        .clone()
        .enqueue_batch(EnqueueBatchRequest {
            items: vec![
                req("refund-1", "{\"amount\":1}"),
                req("refund-1", "{\"amount\":5}"),
                req("refund-2", "{\"amount\":2}"),
                req("refund-3", "{\"amount\":3}"),
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    let ok = |i: usize| match &results[i].result {
        Some(enqueue_batch_result::Result::Enqueued(e)) => e.clone(),
        other => panic!("item {i}: {other:?}"),
    };
    let (first, live, new) = (ok(0), ok(2), ok(3));
    assert_eq!((first.job.unwrap().job_id, first.created), (done, false));
    assert_eq!((live.job.unwrap().job_id, live.created), (young, false));
    assert!(new.created);
    match &results[1].result {
        Some(enqueue_batch_result::Result::Error(e)) => {
            assert_eq!(e.reason, "OPERATION_KEY_CONFLICT");
            assert_eq!(e.metadata["job_id"], done.to_string());
        }
        other => panic!("item 1: {other:?}"),
    }
    assert_eq!(total(&h, "jobs").await, 2, "only refund-3 was created");
    assert_eq!(
        total(&h, "operation_keys").await,
        1,
        "the key record is written once"
    );
}

#[tokio::test]
async fn a_zombie_naming_a_pruned_job_is_refused_and_writes_nothing() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-z", "{}").await;
    let zombie = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(job.job_id).await;
    let current = h.claim_one(Q, "worker-b").await;
    h.client
        .clone()
        .fail(FailRequest {
            job_id: job.job_id,
            attempt: current.attempt,
            disposition: FailDisposition::Failed as i32,
            error: "card closed".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
    finished_days_ago(&h, job.job_id, 40).await;
    assert_eq!(prune(h.coordinator.store(), &thirty_days()).await.jobs, 1);
    let before = (
        total(&h, "job_events").await,
        total(&h, "job_observations").await,
    );

    let id = job.job_id;
    let mut c = h.client.clone();
    let refusals = [
        (
            "Complete",
            c.complete(CompleteRequest {
                job_id: id,
                attempt: zombie.attempt,
                provider_reference: "re_late".into(),
                result: String::new(),
                next: None,
            })
            .await
            .map(|_| ()),
        ),
        (
            "Fail",
            c.fail(FailRequest {
                job_id: id,
                attempt: zombie.attempt,
                disposition: FailDisposition::RetryExecute as i32,
                error: "timeout".into(),
                retry_delay: None,
                provider_retry_after: None,
                next: None,
            })
            .await
            .map(|_| ()),
        ),
        (
            "RenewLease",
            c.renew_lease(RenewLeaseRequest {
                job_id: id,
                attempt: zombie.attempt,
                lease: None,
            })
            .await
            .map(|_| ()),
        ),
        (
            "RecordObservation",
            c.record_observation(RecordObservationRequest {
                job_id: id,
                attempt: zombie.attempt,
                source: ObservationSource::Worker as i32,
                outcome: ObservationOutcome::Succeeded as i32,
                provider_reference: "re_late".into(),
                body: "{}".into(),
                dedup_key: "late-success".into(),
            })
            .await
            .map(|_| ()),
        ),
        (
            "GetJob",
            c.get_job(GetJobRequest { job_id: id }).await.map(|_| ()),
        ),
    ];
    for (rpc, answer) in refusals {
        let status = answer.expect_err(rpc);
        assert_eq!(status.code(), Code::NotFound, "{rpc}: {status:?}");
        assert_eq!(reason(&status), "JOB_PRUNED", "{rpc}");
        assert_eq!(meta(&status, "job_id"), id.to_string(), "{rpc}");
        assert_eq!(meta(&status, "final_state"), "failed", "{rpc}");
        assert_eq!(meta(&status, "operation_key"), "refund-z", "{rpc}");
    }
    assert_eq!(rows_of(&h, id).await, (0, 0, 0), "nothing written");
    assert_eq!(
        (
            total(&h, "job_events").await,
            total(&h, "job_observations").await
        ),
        before,
        "no refusal event, no observation"
    );
    // A job id that never existed is still plainly not found.
    let never = c
        .get_job(GetJobRequest { job_id: id + 1000 })
        .await
        .unwrap_err();
    assert_eq!(reason(&never), "JOB_NOT_FOUND");
}

/// `keys_recorded` counts the records a batch wrote. A record that exists
/// already is left as it is and not counted: the driver reports matched
/// rows (docs/design.md rule 10), so an upsert's no-op would count as one.
#[tokio::test]
async fn a_key_record_already_held_is_neither_rewritten_nor_counted() {
    let h = Harness::start().await;
    let ids = finished_jobs(&h, 3).await;
    // A record of the first job's key, as a batch run again would find it.
    sqlx::query(
        "INSERT INTO operation_keys (queue, operation_key, request_digest, job_id, final_state, \
         attempt, dispatch_count, provider_reference, created_at, finished_at, pruned_at) \
         SELECT queue, operation_key, request_digest, id, state, attempt, dispatch_count, \
         're_kept', created_at, finished_at, UTC_TIMESTAMP(6) FROM jobs WHERE id = ?",
    )
    .bind(ids[0])
    .execute(&h.pool)
    .await
    .unwrap();
    let counts = prune(h.coordinator.store(), &thirty_days()).await;
    assert_eq!(counts.jobs, 3, "{counts:?}");
    assert_eq!(
        counts.keys_recorded, 2,
        "only the two new records: {counts:?}"
    );
    assert_eq!(total(&h, "operation_keys").await, 3);
    let kept: String = sqlx::query_scalar(
        "SELECT CAST(provider_reference AS CHAR) FROM operation_keys WHERE job_id = ?",
    )
    .bind(ids[0])
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(kept, "re_kept", "the record held is left as it was");
}

#[tokio::test]
async fn live_jobs_are_never_pruned_whatever_their_age() {
    let h = Harness::start().await;
    let parked = h.enqueue(Q, "refund-parked", "{}").await.job_id;
    let park = h.claim_one(Q, "w").await;
    assert_eq!(park.job_id, parked);
    h.client
        .clone()
        .fail(FailRequest {
            job_id: parked,
            attempt: park.attempt,
            disposition: FailDisposition::ManualReview as i32,
            error: "ambiguous".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
    let running = h.enqueue(Q, "refund-running", "{}").await.job_id;
    assert_eq!(h.claim_one(Q, "w").await.job_id, running);
    let old = succeeded(&h, "refund-old", "{}").await;
    let ready = h.enqueue(Q, "refund-ready", "{}").await.job_id;
    // A finished_at in the past on live rows too: only the state protects
    // them.
    for id in [ready, running, parked, old] {
        finished_days_ago(&h, id, 400).await;
    }
    let counts = prune(h.coordinator.store(), &thirty_days()).await;
    assert_eq!(counts.jobs, 1, "{counts:?}");
    for (id, state) in [
        (ready, jobfence_domain::JobState::Ready),
        (running, jobfence_domain::JobState::Running),
        (parked, jobfence_domain::JobState::ManualReview),
    ] {
        assert_eq!(h.row(id).await.state, state);
        let (jobs, _, events) = rows_of(&h, id).await;
        assert_eq!(jobs, 1);
        assert!(events >= 1, "job {id} keeps its events");
    }
    assert_eq!(rows_of(&h, old).await, (0, 0, 0));
}

/// Pruned rows, counted from the database: jobs gone, key records written.
async fn assert_all_pruned_once(h: &Harness, ids: &[u64], a: PruneCounts, b: PruneCounts) {
    assert_eq!(
        a.jobs + b.jobs,
        ids.len() as u64,
        "each job deleted by exactly one pruner: {a:?} {b:?}"
    );
    assert_eq!(a.keys_recorded + b.keys_recorded, ids.len() as u64);
    assert_eq!(total(h, "jobs").await, 0);
    assert_eq!(total(h, "job_events").await, 0);
    assert_eq!(total(h, "operation_keys").await, ids.len() as i64);
}

async fn finished_jobs(h: &Harness, n: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = succeeded(h, &format!("refund-{i}"), "{}").await;
        finished_days_ago(h, id, 31).await;
        ids.push(id);
    }
    ids
}

#[tokio::test]
async fn two_pruners_at_once_prune_each_row_once_when_the_second_deletes_first() {
    let h = Harness::start().await;
    let ids = finished_jobs(&h, 6).await;
    let other = JobStore::new(h.db.pool());
    // The first pruner has read its candidates and stops before locking.
    let mut gate = h.pauses.arm(PausePoint::PruneAfterCandidates);
    let store = h.coordinator.store().clone();
    let first = tokio::spawn(async move { store.prune_batch(&thirty_days(), 500).await });
    gate.reached().await;
    // The second prunes the same rows meanwhile (no GET_LOCK here: as two
    // Galera nodes, whose locks do not see each other).
    let (b, _) = other.prune_batch(&thirty_days(), 500).await.unwrap();
    gate.release();
    let (a, _) = first.await.unwrap().unwrap();
    assert_eq!(a.jobs, 0, "the rows were gone when the first locked: {a:?}");
    assert_all_pruned_once(&h, &ids, a, b).await;
}

#[tokio::test]
async fn two_pruners_at_once_prune_each_row_once_when_the_first_holds_the_locks() {
    let h = Harness::start().await;
    let ids = finished_jobs(&h, 6).await;
    let other = JobStore::new(h.db.pool());
    let mut gate = h.pauses.arm(PausePoint::PruneAfterLock);
    let store = h.coordinator.store().clone();
    let first = tokio::spawn(async move { store.prune_batch(&thirty_days(), 500).await });
    gate.reached().await;
    // The second reads the same candidates, skips the locked rows, does
    // not wait for them, and deletes nothing twice.
    let (b, _) = tokio::time::timeout(
        Duration::from_secs(60),
        other.prune_batch(&thirty_days(), 500),
    )
    .await
    .expect("the second pruner waited for the first's locks")
    .unwrap();
    assert_eq!(b.jobs, 0, "{b:?}");
    gate.release();
    let (a, _) = first.await.unwrap().unwrap();
    assert_all_pruned_once(&h, &ids, a, b).await;
}

#[tokio::test]
async fn one_pruner_at_a_time_holds_the_database_lock() {
    let h = Harness::start().await;
    finished_jobs(&h, 2).await;
    let mut holder = h.pool.acquire().await.unwrap();
    let got: i64 =
        sqlx::query_scalar("SELECT GET_LOCK(CONCAT('jobfence_pruner.', LEFT(DATABASE(), 48)), 0)")
            .fetch_one(&mut *holder)
            .await
            .unwrap();
    assert_eq!(got, 1);
    let run = h
        .coordinator
        .store()
        .prune(&thirty_days(), 500, |_| {})
        .await
        .unwrap();
    assert_eq!(run, PruneRun::LockHeld);
    assert_eq!(total(&h, "jobs").await, 2, "nothing pruned while held");
    sqlx::query("DO RELEASE_LOCK(CONCAT('jobfence_pruner.', LEFT(DATABASE(), 48)))")
        .execute(&mut *holder)
        .await
        .unwrap();
    assert_eq!(prune(h.coordinator.store(), &thirty_days()).await.jobs, 2);
}

#[tokio::test]
async fn an_events_consumer_behind_the_pruned_range_is_refused() {
    let h = Harness::start().await;
    let old = succeeded(&h, "refund-old", "{}").await;
    let live = h.enqueue(Q, "refund-live", "{}").await.job_id;
    finished_days_ago(&h, old, 31).await;
    let mut feed = JobEventsClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let list = |after: u64| ListEventsRequest {
        after_event_id: after,
        limit: 100,
        queue: String::new(),
    };
    let before = feed.list_events(list(0)).await.unwrap().into_inner();
    assert!(before.events.len() >= 4);
    prune(h.coordinator.store(), &thirty_days()).await;
    let pruned_through: u64 =
        sqlx::query_scalar("SELECT events_pruned_through FROM pruning_marks WHERE singleton = 1")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert!(pruned_through > 0);

    // From the start, and from just below the mark: refused, never a jump.
    for after in [0, pruned_through - 1] {
        let refused = feed.list_events(list(after)).await.unwrap_err();
        assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
        assert_eq!(reason(&refused), "EVENTS_CURSOR_PRUNED");
        assert_eq!(
            meta(&refused, "pruned_through_event_id"),
            pruned_through.to_string()
        );
    }
    // From the mark on, the feed serves what is held.
    let after = feed
        .list_events(list(pruned_through))
        .await
        .unwrap()
        .into_inner();
    assert!(after.events.iter().all(|e| e.job_id != old));
    let _ = live;
}

#[tokio::test]
async fn a_queues_stored_retention_overrides_the_default() {
    let h = Harness::start().await;
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let policy = |retention: prost_types::Duration| PutQueuePolicyRequest {
        queue: "fast".into(),
        resend_window: kit::secs(3600),
        max_dispatches: Some(3),
        job_retention: Some(retention),
        operator: "alice".into(),
        reason: "this queue's audit trail lives elsewhere".into(),
    };
    let bad = admin
        .put_queue_policy(policy(prost_types::Duration {
            seconds: 0,
            nanos: 500_000_000,
        }))
        .await
        .unwrap_err();
    assert_eq!(reason(&bad), "INVALID_REQUEST");
    assert!(bad.message().contains("job_retention"), "{bad:?}");
    let stored = admin
        .put_queue_policy(policy(prost_types::Duration {
            seconds: 86_400,
            nanos: 0,
        }))
        .await
        .unwrap()
        .into_inner()
        .policy
        .unwrap();
    assert_eq!(stored.job_retention.unwrap().seconds, 86_400);

    // Two days old: past the queue's day, inside the default 30 days.
    let slow = succeeded(&h, "refund-slow", "{}").await;
    let fast = h
        .client
        .clone()
        .enqueue(EnqueueRequest {
            queue: "fast".into(),
            ..req("refund-fast", "{}")
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
        .job_id;
    sqlx::query("UPDATE jobs SET state = 'succeeded', finished_at = UTC_TIMESTAMP(6) WHERE id = ?")
        .bind(fast)
        .execute(&h.pool)
        .await
        .unwrap();
    finished_days_ago(&h, slow, 2).await;
    finished_days_ago(&h, fast, 2).await;
    let counts = prune(h.coordinator.store(), &thirty_days()).await;
    assert_eq!(counts.jobs, 1, "{counts:?}");
    assert_eq!(rows_of(&h, fast).await.0, 0);
    assert_eq!(rows_of(&h, slow).await.0, 1);
    // Key records outlive their queue's jobs: with a key retention of 1 s,
    // the record of a "fast" job finished 12 h ago stays (its queue keeps
    // jobs a day); the one of the default queue (1 s here) goes.
    sqlx::query(
        "UPDATE operation_keys SET finished_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 12 HOUR) \
         WHERE queue = 'fast'",
    )
    .execute(&h.pool)
    .await
    .unwrap();
    let short = Retention {
        jobs: Duration::from_secs(1),
        keys: Some(Duration::from_secs(1)),
    };
    let counts = prune(h.coordinator.store(), &short).await;
    assert_eq!((counts.jobs, counts.keys_pruned), (1, 1), "{counts:?}");
    let left: Vec<String> =
        sqlx::query_scalar("SELECT CONVERT(queue USING utf8mb4) FROM operation_keys")
            .fetch_all(&h.pool)
            .await
            .unwrap();
    assert_eq!(left, ["fast"]);
}
