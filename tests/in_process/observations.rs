//! RecordObservation never changes a job (docs/design.md rule 7): the whole
//! `jobs` row, every column as stored, is the same before and after, for
//! a running job observed by its current attempt and for a webhook's
//! "succeeded" on a ready job and on a job in manual review, but for
//! `has_observations`, which its first observation sets (a claim reads a
//! job's observations only when it is set). The observation itself is
//! recorded (and its event appended).

use jobfence_testkit as kit;

use jobfence_api::v1::{
    ClaimedJob, CompleteRequest, FailDisposition, FailRequest, NextJobsRequest, ObservationOutcome,
    ObservationSource, RecordObservationRequest, TakeoverRequest,
};
use jobfence_domain::JobState;
use kit::{secs, Harness};

const Q: &str = "refunds";

/// Every column of the job's row but `has_observations`, each as the hex
/// of its stored value (NULL stays null), in the table's column order: a
/// change to any column, including ones no test names, changes this.
async fn full_row(h: &Harness, job_id: u64) -> String {
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(COLUMN_NAME AS CHAR) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'jobs' \
           AND COLUMN_NAME <> 'has_observations' ORDER BY ORDINAL_POSITION",
    )
    .fetch_all(&h.pool)
    .await
    .unwrap();
    assert!(columns.len() > 15, "the jobs table: {columns:?}");
    let list = columns
        .iter()
        .map(|c| format!("'{c}', HEX(`{c}`)"))
        .collect::<Vec<_>>()
        .join(", ");
    sqlx::query_scalar(&format!(
        "SELECT CAST(JSON_OBJECT({list}) AS CHAR) FROM jobs WHERE id = ?"
    ))
    .bind(job_id)
    .fetch_one(&h.pool)
    .await
    .unwrap()
}

fn observation(
    job_id: u64,
    attempt: u64,
    source: ObservationSource,
    key: &str,
) -> RecordObservationRequest {
    RecordObservationRequest {
        job_id,
        attempt,
        source: source as i32,
        outcome: ObservationOutcome::Succeeded as i32,
        provider_reference: "re_seen".into(),
        body: "{\"status\":\"succeeded\"}".into(),
        dedup_key: key.into(),
    }
}

/// The de-duplication keys of the observations a job went out with.
fn dedup_keys(job: &ClaimedJob) -> Vec<&str> {
    job.observations
        .iter()
        .map(|o| o.dedup_key.as_str())
        .collect()
}

/// How many observations of the job are stored.
async fn kept_observations(h: &Harness, job_id: u64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM job_observations WHERE job_id = ?")
        .bind(job_id)
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

async fn has_observations(h: &Harness, job_id: u64) -> i64 {
    sqlx::query_scalar("SELECT has_observations FROM jobs WHERE id = ?")
        .bind(job_id)
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

/// Records `obs` and checks that the job's row did not change at all,
/// and that the observation was kept.
async fn observe_changes_nothing(h: &Harness, obs: RecordObservationRequest, state: JobState) {
    let job_id = obs.job_id;
    let before = full_row(h, job_id).await;
    assert_eq!(has_observations(h, job_id).await, 0);
    assert_eq!(h.row(job_id).await.state, state);
    let recorded = h
        .client
        .clone()
        .record_observation(obs)
        .await
        .expect("an observation is always accepted")
        .into_inner();
    assert_eq!(recorded.observation.unwrap().job_id, job_id);
    assert_eq!(full_row(h, job_id).await, before, "the job's row changed");
    assert_eq!(
        has_observations(h, job_id).await,
        1,
        "the first observation sets the job's flag"
    );
    assert_eq!(kept_observations(h, job_id).await, 1);
    assert_eq!(h.count_events(job_id, "observation_recorded").await, 1);
}

#[tokio::test]
async fn the_current_attempts_success_observation_leaves_the_running_row_as_it_was() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let job = h.claim_one(Q, "worker-a").await;
    let obs = observation(job.job_id, job.attempt, ObservationSource::Worker, "w-1");
    observe_changes_nothing(&h, obs, JobState::Running).await;
    h.finish().await;
}

#[tokio::test]
async fn a_webhooks_success_leaves_a_ready_job_as_it_was() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let obs = observation(job.job_id, 0, ObservationSource::Webhook, "evt_1");
    observe_changes_nothing(&h, obs, JobState::Ready).await;
    h.finish().await;
}

#[tokio::test]
async fn a_webhooks_success_leaves_a_job_in_manual_review_as_it_was() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let job = h.claim_one(Q, "worker-a").await;
    h.client
        .clone()
        .fail(FailRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            disposition: FailDisposition::ManualReview as i32,
            error: "the provider answered nonsense".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
    let obs = observation(job.job_id, 0, ObservationSource::Webhook, "evt_1");
    observe_changes_nothing(&h, obs, JobState::ManualReview).await;
    h.finish().await;
}

/// A ready job's observations go out with it, by a Claim and by a
/// Complete that claims its caller's next job: both read the job's flag
/// (set by its first observation) in their ready scan. A job without
/// observations goes out without any.
#[tokio::test]
async fn a_ready_jobs_observations_go_out_with_its_claim_and_with_a_complete_that_claims_it() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let second = h.enqueue(Q, "refund-2", "{}").await;
    let third = h.enqueue(Q, "refund-3", "{}").await;
    for (job, key) in [(&second, "evt_2"), (&third, "evt_3")] {
        h.client
            .clone()
            .record_observation(observation(job.job_id, 0, ObservationSource::Webhook, key))
            .await
            .expect("an observation of a ready job is accepted");
    }
    let mut first = h.claim(Q, "worker-a", 1).await;
    assert_eq!(first.len(), 1);
    assert!(first[0].observations.is_empty(), "refund-1 has none");
    let first = first.remove(0).job.unwrap();
    let answer = h
        .client
        .clone()
        .complete(CompleteRequest {
            job_id: first.job_id,
            attempt: first.attempt,
            provider_reference: "re_1".into(),
            result: String::new(),
            next: Some(NextJobsRequest {
                queue: Q.into(),
                worker_id: "worker-a".into(),
                max_jobs: 1,
                lease: secs(30),
                wait: None,
            }),
        })
        .await
        .expect("the Complete with a next job applies")
        .into_inner();
    let handed = answer.next.expect("a next-jobs answer").jobs;
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].job.as_ref().unwrap().job_id, second.job_id);
    let seen = dedup_keys(&handed[0]);
    assert_eq!(
        seen,
        ["evt_2"],
        "the next job goes out with its observation"
    );
    let claimed = h.claim(Q, "worker-b", 1).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job.as_ref().unwrap().job_id, third.job_id);
    let seen = dedup_keys(&claimed[0]);
    assert_eq!(
        seen,
        ["evt_3"],
        "a claimed job goes out with its observation"
    );
    h.finish().await;
}

/// A named Takeover hands the job out with the observations recorded
/// while it ran: its lock reads the job's flag.
#[tokio::test]
async fn a_named_takeover_hands_the_job_out_with_its_observations() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let job = h.claim_one(Q, "worker-a").await;
    let obs = observation(job.job_id, job.attempt, ObservationSource::Worker, "sent");
    h.client.clone().record_observation(obs).await.unwrap();
    h.force_lease_expired(job.job_id).await;
    let taken = h
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: job.job_id,
            worker_id: "worker-b".into(),
            lease: secs(30),
        })
        .await
        .expect("an expired lease is taken over")
        .into_inner()
        .claimed
        .expect("the job handed out");
    let seen = dedup_keys(&taken);
    assert_eq!(
        seen,
        ["sent"],
        "the takeover sees what the first attempt recorded"
    );
    h.finish().await;
}

/// A job whose flag is not set although it has an observation (one
/// recorded by a coordinator older than the flag, during a rolling
/// upgrade) gets it from a repeat of that observation, and its next claim
/// sees the observation.
#[tokio::test]
async fn a_repeated_observation_sets_a_missing_flag() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let obs = observation(job.job_id, 0, ObservationSource::Webhook, "evt_1");
    h.client
        .clone()
        .record_observation(obs.clone())
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET has_observations = 0 WHERE id = ?")
        .bind(job.job_id)
        .execute(&h.pool)
        .await
        .unwrap();
    let again = h.client.clone().record_observation(obs).await.unwrap();
    assert!(again.into_inner().duplicate);
    assert_eq!(has_observations(&h, job.job_id).await, 1);
    let claimed = h.claim(Q, "worker-a", 1).await;
    assert_eq!(claimed[0].observations.len(), 1);
    h.finish().await;
}

/// Two first observations of one job at once: the second waits for the
/// first's lock on the job's row (an exclusive one: in share mode both
/// would hold it, and each would then wait for the other to write the
/// flag, a deadlock run again), then records its own. Both are kept, the
/// flag is set once, and nothing was run again.
#[tokio::test]
async fn two_first_observations_of_one_job_wait_in_turn_without_a_deadlock() {
    let h = Harness::start().await;
    let job_id = h.enqueue(Q, "refund-1", "{}").await.job_id;
    let mut gate = h
        .pauses
        .arm(jobfence_store::PausePoint::ObservationAfterLock);
    let mut a = h.another_client().await;
    let first = tokio::spawn(async move {
        a.record_observation(observation(job_id, 0, ObservationSource::Webhook, "evt_a"))
            .await
    });
    gate.reached().await;
    let mut b = h.another_client().await;
    let second = tokio::spawn(async move {
        b.record_observation(observation(job_id, 0, ObservationSource::Webhook, "evt_b"))
            .await
    });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    gate.release();
    for (call, key) in [(first, "evt_a"), (second, "evt_b")] {
        let kept = call.await.unwrap().expect("recorded").into_inner();
        assert!(!kept.duplicate, "{key}");
    }
    assert_eq!(
        h.coordinator.store().conflicts().0,
        0,
        "neither was run again"
    );
    assert_eq!(has_observations(&h, job_id).await, 1);
    assert_eq!(kept_observations(&h, job_id).await, 2);
    h.finish().await;
}

/// Migration `20261210000001` sets the flag of the jobs observed before
/// it, and only theirs: a database migrated up to the one before it gets
/// a job with an observation and one without, then the rest.
#[tokio::test]
async fn the_flags_migration_flags_the_jobs_observed_before_it() {
    let db = kit::TestDb::empty().await;
    let pool = db.pool();
    let dir = std::env::temp_dir().join(format!("jf_migrations_{}", db.name));
    std::fs::create_dir_all(&dir).unwrap();
    // This suite is built from crates/testkit; the migrations are at the top.
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.as_str() < "20261210000001" {
            std::fs::copy(&path, dir.join(&name)).unwrap();
        }
    }
    let before = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    before
        .run(&pool)
        .await
        .expect("the migrations before the flag's");
    std::fs::remove_dir_all(&dir).unwrap();
    for key in ["observed", "quiet"] {
        sqlx::query(
            "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, run_at, \
             created_at, updated_at) VALUES (?, ?, UNHEX(SHA2(?, 256)), '{}', 'ready', \
             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        )
        .bind(Q)
        .bind(key)
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO job_observations (job_id, attempt, source, outcome, body, dedup_key, \
         recorded_at) SELECT id, 0, 'webhook', 'succeeded', '{}', 'evt_1', UTC_TIMESTAMP(6) \
         FROM jobs WHERE operation_key = 'observed'",
    )
    .execute(&pool)
    .await
    .unwrap();
    jobfence_store::MIGRATOR.run(&pool).await.expect("the rest");
    let flags: Vec<(String, i64)> = sqlx::query_as(
        "SELECT CAST(operation_key AS CHAR), has_observations FROM jobs ORDER BY operation_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(flags, [("observed".into(), 1), ("quiet".into(), 0)]);
    pool.close().await;
}
