//! Settlement's races, on deterministic schedules (pause points): the
//! automatic resolution of a manual review losing cleanly to a person and
//! a worker who moved the job first, and winning against an operator who
//! comes second; two imports of one report at once; an import cut off
//! midway and run again; a lock wait on the lines, run again and counted;
//! a refund observed on a live job that then fails (before or while its
//! line is decided), decided again.

use crate::settlement::{
    failed, import, line, payload, provider, succeeded, unresolved, until_now, P, Q,
};
use jobfence_testkit as kit;

use jobfence_api::v1::{CompleteRequest, FailDisposition, Resolution, ResolveManualReviewRequest};
use jobfence_core::settlement::ImportHeader;
use jobfence_domain::settlement::ExceptionKind;
use jobfence_domain::JobState;
use jobfence_store::PausePoint;
use kit::{reason, Harness};
use tonic::Code;

fn header() -> ImportHeader {
    ImportHeader {
        provider: P.into(),
        period: until_now(),
        operator: "alice".into(),
        check_only: false,
        allow_empty: false,
    }
}

fn resolve(job_id: u64, attempt: u64, to: Resolution) -> ResolveManualReviewRequest {
    ResolveManualReviewRequest {
        job_id,
        attempt,
        resolution: to as i32,
        operator: "bob".into(),
        reason: "looked at the dashboard".into(),
        provider_reference: "re_bob".into(),
        ..Default::default()
    }
}

async fn admin(
    h: &Harness,
) -> jobfence_api::v1::job_admin_client::JobAdminClient<tonic::transport::Channel> {
    jobfence_api::v1::job_admin_client::JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
}

/// Alice's import of `lines`, run on a task of its own (to be paused).
fn spawn_import(
    h: &Harness,
    lines: Vec<jobfence_domain::settlement::mapping::RawLine>,
) -> tokio::task::JoinHandle<jobfence_core::settlement::ImportSummary> {
    let c = h.coordinator.clone();
    tokio::spawn(async move {
        let mut import = c.start_import(header()).await.unwrap();
        import.lines(&lines).await.unwrap();
        import.finish().await.unwrap()
    })
}

/// The worker holding `held` fails it for good (the provider declined).
async fn decline(h: &Harness, held: &jobfence_api::v1::Job) {
    h.client
        .clone()
        .fail(jobfence_api::v1::FailRequest {
            job_id: held.job_id,
            attempt: held.attempt,
            disposition: FailDisposition::Failed as i32,
            error: "declined".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
}

/// Settlement read the job in manual review; before it resolves, an
/// operator sends it back to a worker, who completes it. The automatic
/// resolution is refused like any stale write, the key is decided again
/// and matched: the worker's result stands, nothing is overwritten.
#[tokio::test]
async fn the_automatic_resolution_loses_cleanly_to_a_worker_that_finished_first() {
    let h = Harness::start().await;
    provider(&h).await;
    let parked = failed(&h, "refund-parked", FailDisposition::ManualReview).await;
    let attempt = h.row(parked).await.attempt;
    let mut gate = h.pauses.arm(PausePoint::SettlementAfterHolders);
    let importing = {
        let h_coord = h.coordinator.clone();
        tokio::spawn(async move {
            let mut import = h_coord.start_import(header()).await.unwrap();
            import
                .lines(&[line(2, "re_s", "refund-parked", 500, "succeeded")])
                .await
                .unwrap();
            import.finish().await.unwrap()
        })
    };
    gate.reached().await;
    admin(&h)
        .await
        .resolve_manual_review(resolve(parked, attempt, Resolution::RetryReconcile))
        .await
        .expect("the operator moves the job first");
    let claimed = h.claim_one(Q, "worker-b").await;
    assert_eq!(claimed.job_id, parked);
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: parked,
            attempt: claimed.attempt,
            provider_reference: "re_s".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
    gate.release();
    let summary = importing.await.unwrap();
    assert!(summary.decided.resolved.is_empty(), "{summary:?}");
    assert_eq!(summary.decided.matched, 1, "decided again: matched");
    let row = h.row(parked).await;
    assert_eq!(
        (row.state, row.attempt),
        (JobState::Succeeded, claimed.attempt)
    );
    assert_eq!(
        h.count_events(parked, "manual_review_resolved").await,
        1,
        "only bob's"
    );
    assert!(unresolved(&h).await.is_empty());
    h.finish().await;
}

/// Settlement holds the job's row with its resolution under way; an
/// operator resolving the same job waits for the lock and is refused:
/// the job was resolved first, by the report.
#[tokio::test]
async fn the_automatic_resolution_wins_against_an_operator_who_comes_second() {
    let h = Harness::start().await;
    provider(&h).await;
    let parked = failed(&h, "refund-parked", FailDisposition::ManualReview).await;
    let attempt = h.row(parked).await.attempt;
    let mut gate = h.pauses.arm(PausePoint::ResolveAfterLock);
    let importing = {
        let h_coord = h.coordinator.clone();
        tokio::spawn(async move {
            let mut import = h_coord.start_import(header()).await.unwrap();
            import
                .lines(&[line(2, "re_s", "refund-parked", 500, "succeeded")])
                .await
                .unwrap();
            import.finish().await.unwrap()
        })
    };
    gate.reached().await;
    let mut bob = admin(&h).await;
    let second = tokio::spawn(async move {
        bob.resolve_manual_review(resolve(parked, attempt, Resolution::Failed))
            .await
    });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    gate.release();
    let summary = importing.await.unwrap();
    assert_eq!(summary.decided.resolved, vec![(parked, "re_s".to_owned())]);
    let refused = second.await.unwrap().expect_err("bob comes second");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(reason(&refused), "JOB_NOT_IN_MANUAL_REVIEW");
    let row = h.row(parked).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.provider_reference.as_deref(), Some("re_s"));
    h.finish().await;
}

/// Two operators import the same report at once: one raises the double
/// refund while the other has read that it is not there yet; the second's
/// insert meets the first's row, is run again (counted) and finds it.
/// One exception, opened once.
#[tokio::test]
async fn one_report_imported_twice_at_once_raises_each_exception_once() {
    let h = Harness::start().await;
    provider(&h).await;
    let _twice = succeeded(&h, "refund-twice", 500).await;
    let report = [
        line(2, "re_t1", "refund-twice", 500, "succeeded"),
        line(3, "re_t2", "refund-twice", 500, "succeeded"),
    ];
    let mut gate = h.pauses.arm(PausePoint::SettlementRaiseAfterRead);
    let first = {
        let (c, report) = (h.coordinator.clone(), report.clone());
        tokio::spawn(async move {
            let mut import = c.start_import(header()).await.unwrap();
            import.lines(&report).await.unwrap();
            import.finish().await.unwrap()
        })
    };
    gate.reached().await;
    let second = import(&h, &report).await;
    gate.release();
    let first = first.await.unwrap();
    assert_eq!(
        first.decided.exceptions_opened + second.decided.exceptions_opened,
        1,
        "{first:?} {second:?}"
    );
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::DoubleRefund, "refund-twice".into())]
    );
    let (actions, lines): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM settlement_exception_actions), \
         (SELECT COUNT(*) FROM settlement_lines)",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!((actions, lines), (1, 2), "one 'opened', each line once");
    assert!(
        h.coordinator.store().conflicts().0 >= 1,
        "the second insert was run again"
    );
    h.finish().await;
}

/// Two imports of one report decide one manual review at once: the one
/// that read the job second finds it resolved by the first (its own
/// resolution answered as a replay) and decides the key again, matched.
/// The review is resolved once, listed and counted by one import only.
#[tokio::test]
async fn a_review_resolved_by_two_imports_at_once_is_counted_once() {
    let h = Harness::start().await;
    provider(&h).await;
    let parked = failed(&h, "refund-parked", FailDisposition::ManualReview).await;
    let report = [line(2, "re_p", "refund-parked", 500, "succeeded")];
    let mut gate = h.pauses.arm(PausePoint::SettlementAfterHolders);
    let late = {
        let (c, report) = (h.coordinator.clone(), report.clone());
        tokio::spawn(async move {
            let mut import = c.start_import(header()).await.unwrap();
            import.lines(&report).await.unwrap();
            import.finish().await.unwrap()
        })
    };
    gate.reached().await;
    let first = import(&h, &report).await;
    gate.release();
    let late = late.await.unwrap();
    assert_eq!(first.decided.resolved, vec![(parked, "re_p".to_owned())]);
    assert!(late.decided.resolved.is_empty(), "{late:?}");
    assert_eq!(late.decided.matched, 1, "decided again: matched; {late:?}");
    assert_eq!(h.row(parked).await.state, JobState::Succeeded);
    assert_eq!(h.count_events(parked, "manual_review_resolved").await, 1);
    let metrics = h.coordinator.metrics().render();
    assert!(
        metrics.contains("jobfence_settlement_resolved_reviews_total{provider=\"psp\"} 1"),
        "{metrics}"
    );
    h.finish().await;
}

/// An import reads and locks the jobs that hold its lines' keys, and only
/// those, when its provider has two queues: while its batch is held
/// (paused before the insert, the holders locked), a worker claims a ready
/// job of the provider's other queue. Fails when the queues are matched as
/// a list (`j.queue IN (…)`, as holders_jobs.sql once did): MariaDB then
/// scans and locks every job of both queues, and the Claim, which skips
/// locked rows, finds nothing.
#[tokio::test]
async fn an_import_for_a_provider_of_two_queues_locks_only_its_keys_jobs() {
    const Q2: &str = "refunds-eu";
    let h = Harness::start().await;
    provider(&h).await;
    h.coordinator
        .store()
        .put_provider(&jobfence_domain::providers::PutProvider {
            name: P.into(),
            budget: jobfence_domain::budget::Budget {
                rate_per_second: 1000.0,
                burst: 1000,
                max_in_flight: None,
                execute_cost: 1,
                reconcile_cost: 1,
                per_key: Default::default(),
            },
            queues: vec![Q.into(), Q2.into()],
            by: kit::settlement::by(),
        })
        .await
        .unwrap();
    succeeded(&h, "refund-a", 500).await;
    let other = h.enqueue(Q2, "refund-b", &payload(700)).await;
    let mut gate = h.pauses.arm(PausePoint::SettlementBeforeInsert);
    let import = spawn_import(&h, vec![line(2, "re_a", "refund-a", 500, "succeeded")]);
    gate.reached().await;
    let claimed: Vec<u64> = h
        .claim(Q2, "w2", 1)
        .await
        .iter()
        .map(|c| c.job.as_ref().unwrap().job_id)
        .collect();
    assert_eq!(
        claimed,
        vec![other.job_id],
        "the held batch locked a job it does not match"
    );
    gate.release();
    let summary = import.await.unwrap();
    assert_eq!(summary.decided.matched, 1, "{summary:?}");
    h.finish().await;
}

/// Two imports, each with one refund of the same succeeded job's key,
/// at once: the first has found no other line of the key and is about to
/// insert its line decided (matched); the second waits for the job's row
/// lock, and after the first commits it finds the first's line, so the
/// key is decided with both: a double refund, not two matches.
#[tokio::test]
async fn two_imports_each_with_one_refund_of_a_key_find_the_double_refund() {
    let h = Harness::start().await;
    provider(&h).await;
    succeeded(&h, "refund-twice", 500).await;
    let mut gate = h.pauses.arm(PausePoint::SettlementBeforeInsert);
    let first = {
        let c = h.coordinator.clone();
        tokio::spawn(async move {
            let mut import = c.start_import(header()).await.unwrap();
            import
                .lines(&[line(2, "re_t1", "refund-twice", 500, "succeeded")])
                .await
                .unwrap();
            import.finish().await.unwrap()
        })
    };
    gate.reached().await;
    let second = {
        let c = h.coordinator.clone();
        tokio::spawn(async move {
            let mut import = c.start_import(header()).await.unwrap();
            import
                .lines(&[line(2, "re_t2", "refund-twice", 500, "succeeded")])
                .await
                .unwrap();
            import.finish().await.unwrap()
        })
    };
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    gate.release();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.decided.matched, 1, "{first:?}");
    assert_eq!(second.decided.matched, 0, "{second:?}");
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::DoubleRefund, "refund-twice".into())]
    );
    h.finish().await;
}

/// A batch of lines waits for another import's lock on the same lines
/// past its lock wait timeout: run again, counted, then applied.
#[tokio::test]
async fn a_lock_wait_on_the_lines_is_run_again_and_counted() {
    let h = Harness::start_with_lock_wait(1).await;
    provider(&h).await;
    let _ok = succeeded(&h, "refund-ok", 500).await;
    let report = [line(2, "re_ok", "refund-ok", 500, "pending")];
    import(&h, &report).await;
    let settled = [line(2, "re_ok", "refund-ok", 500, "succeeded")];
    let mut gate = h.pauses.arm(PausePoint::SettlementLinesLocked);
    let first = {
        let (c, settled) = (h.coordinator.clone(), settled.clone());
        tokio::spawn(async move {
            let mut import = c.start_import(header()).await.unwrap();
            import.lines(&settled).await.unwrap();
            import.finish().await.unwrap()
        })
    };
    gate.reached().await;
    let second = {
        let (c, settled) = (h.coordinator.clone(), settled.clone());
        tokio::spawn(async move {
            let mut import = c.start_import(header()).await.unwrap();
            import.lines(&settled).await.unwrap();
            import.finish().await.unwrap()
        })
    };
    let store = h.coordinator.store().clone();
    kit::until(
        "the second import's lock wait timed out and was run again",
        || store.conflicts().0 >= 1,
    )
    .await;
    gate.release();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(
        first.lines.updated + second.lines.updated,
        1,
        "{first:?} {second:?}"
    );
    assert_eq!(first.lines.unchanged + second.lines.unchanged, 1);
    assert_eq!(
        h.coordinator.store().conflicts().1,
        0,
        "none reached a caller"
    );
    h.finish().await;
}

/// What an import leaves, as rows of the tables it writes: the jobs'
/// states, the lines, the exceptions and the settlement observations.
async fn settled_state(h: &Harness) -> Vec<String> {
    let mut out = Vec::new();
    for sql in [
        "SELECT CAST(CONCAT_WS(' ', operation_key, state, COALESCE(provider_reference, '-')) AS CHAR) FROM jobs ORDER BY operation_key",
        "SELECT CAST(CONCAT_WS(' ', provider_reference, operation_key, status, decided_at IS NOT NULL) AS CHAR) FROM settlement_lines ORDER BY provider_reference",
        "SELECT CAST(CONCAT_WS(' ', kind, subject, state) AS CHAR) FROM settlement_exceptions ORDER BY kind, subject",
        "SELECT CAST(CONCAT_WS(' ', source, provider_reference, dedup_key) AS CHAR) FROM job_observations WHERE source = 'settlement' ORDER BY dedup_key",
    ] {
        let rows: Vec<String> = sqlx::query_scalar(sql).fetch_all(&h.pool).await.unwrap();
        out.extend(rows);
    }
    out
}

/// The same jobs on a fresh database: two succeeded, one parked, one
/// failed.
async fn jobs_for_the_cut(h: &Harness) {
    provider(h).await;
    succeeded(h, "refund-a", 500).await;
    succeeded(h, "refund-b", 500).await;
    failed(h, "refund-parked", FailDisposition::ManualReview).await;
    failed(h, "refund-failed", FailDisposition::Failed).await;
}

fn report_for_the_cut() -> Vec<jobfence_domain::settlement::mapping::RawLine> {
    vec![
        line(2, "re_a", "refund-a", 500, "succeeded"),
        line(3, "re_p", "refund-parked", 500, "succeeded"),
        line(4, "re_f", "refund-failed", 500, "succeeded"),
        line(5, "re_x", "by-hand", 900, "succeeded"),
    ]
}

/// An import cut off after its lines were written and before the ones
/// that need more than their insert were decided (the importing call
/// dropped: a client or a coordinator killed) is run again, and ends in
/// exactly the state one clean import leaves.
#[tokio::test]
async fn an_import_cut_off_midway_and_run_again_ends_as_one_clean_import() {
    let clean = Harness::start().await;
    jobs_for_the_cut(&clean).await;
    import(&clean, &report_for_the_cut()).await;
    let want = settled_state(&clean).await;

    let h = Harness::start().await;
    jobs_for_the_cut(&h).await;
    let mut gate = h.pauses.arm(PausePoint::SettlementBeforeDecide);
    let cut = {
        let c = h.coordinator.clone();
        tokio::spawn(async move {
            let mut import = c.start_import(header()).await.unwrap();
            import.lines(&report_for_the_cut()).await.unwrap();
            import.finish().await.unwrap()
        })
    };
    gate.reached().await;
    cut.abort();
    assert!(cut.await.unwrap_err().is_cancelled());
    drop(gate);
    let undecided: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM settlement_lines WHERE decided_at IS NULL")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(
        undecided, 3,
        "the cut import wrote its lines; only refund-a's match was decided \
         with its insert, the three that need more were left undecided"
    );
    import(&h, &report_for_the_cut()).await;
    // Job ids and times differ between the two databases; the states, the
    // lines, the exceptions and the observations must not.
    assert_eq!(settled_state(&h).await, want);
    clean.finish().await;
    h.finish().await;
}

/// A settled refund kept as an observation of a running job, whose worker
/// then fails the job anyway: the next import decides the line again and
/// raises REFUND_NOT_RECORDED (money moved that jobfence says did not),
/// once, though that import's undecide waits for a line another import
/// holds locked (a pause point) until its lock wait times out, and is run
/// again and counted.
#[tokio::test]
async fn a_refund_observed_on_a_live_job_that_then_fails_is_a_refund_not_recorded() {
    let h = Harness::start_with_lock_wait(1).await;
    provider(&h).await;
    h.enqueue(Q, "refund-end", &crate::settlement::payload(500))
        .await;
    let held = h.claim_one(Q, "worker-a").await;
    let settled = [line(2, "re_end", "refund-end", 500, "succeeded")];
    assert_eq!(import(&h, &settled).await.decided.observed, 1);
    decline(&h, &held).await;
    assert!(
        unresolved(&h).await.is_empty(),
        "nothing raised before an import"
    );

    // One import holds the line locked; another, with a line of its own,
    // waits for it in its undecide until its lock wait times out.
    let mut gate = h.pauses.arm(PausePoint::SettlementLinesLocked);
    let import_of = |lines: Vec<_>| spawn_import(&h, lines);
    let holding = import_of(settled.to_vec());
    gate.reached().await;
    let other = [line(2, "re_other", "refund-other", 500, "pending")];
    let waiting = import_of(other.to_vec());
    let store = h.coordinator.store().clone();
    kit::until(
        "the undecide's lock wait timed out and was run again",
        || store.conflicts().0 >= 1,
    )
    .await;
    gate.release();
    let (holding, waiting) = (holding.await.unwrap(), waiting.await.unwrap());
    assert_eq!(
        holding.decided.exceptions_opened + waiting.decided.exceptions_opened,
        1,
        "{holding:?} {waiting:?}"
    );
    assert_eq!(
        unresolved(&h).await,
        [(ExceptionKind::RefundNotRecorded, "refund-end".to_owned())]
    );
    // Decided knowing the job ended: a later import leaves it alone.
    let again = import(&h, &settled).await;
    assert_eq!(again.decided.exceptions_opened, 0, "{again:?}");
    h.finish().await;
}

/// The decision of a batch reads a running job (unlocked) and keeps the
/// settled line as its observation; the worker fails the job before the
/// line is marked decided, so the mark comes after the job's end. The
/// same import, once its lines are in, still raises REFUND_NOT_RECORDED:
/// what was raised decides, not when the line was marked.
#[tokio::test]
async fn a_job_failed_while_its_refund_is_being_decided_is_a_refund_not_recorded() {
    let h = Harness::start().await;
    provider(&h).await;
    h.enqueue(Q, "refund-late", &crate::settlement::payload(500))
        .await;
    let held = h.claim_one(Q, "worker-a").await;
    let settled = [line(2, "re_late", "refund-late", 500, "succeeded")];
    let mut gate = h.pauses.arm(PausePoint::SettlementAfterHolders);
    let importing = spawn_import(&h, settled.to_vec());
    gate.reached().await;
    decline(&h, &held).await;
    gate.release();
    let summary = importing.await.unwrap();
    assert_eq!(summary.decided.observed, 1, "read running: {summary:?}");
    assert_eq!(summary.decided.exceptions_opened, 1, "{summary:?}");
    assert_eq!(
        unresolved(&h).await,
        [(ExceptionKind::RefundNotRecorded, "refund-late".to_owned())]
    );
    let again = import(&h, &settled).await;
    assert_eq!(again.decided.exceptions_opened, 0, "raised once: {again:?}");
    h.finish().await;
}
