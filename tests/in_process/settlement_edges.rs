//! The settlement import's edge cases, each against what the docs promise
//! (docs/settlement.md, docs/design.md rule 15, docs/operating.md): a line
//! with no operation key matched by the provider reference a job
//! recorded; a key two of the provider's queues hold (a job, or a pruned
//! job's key record); a refused line that leaves its refund as it was; the
//! same report imported again, and over overlapping periods; two reports
//! of one refund imported at once; the exceptions list cut at its limit.
//! Four once failed; each says what was wrong.

use jobfence_testkit as kit;

use crate::settlement::{import, line, payload, provider, succeeded, unresolved, until_now, P, Q};
use jobfence_api::v1::{CompleteRequest, FailDisposition, FailRequest};
use jobfence_core::settlement::ImportSummary;
use jobfence_domain::budget::Budget;
use jobfence_domain::providers::PutProvider;
use jobfence_domain::settlement::mapping::{Mapping, RawLine, TimeFormat};
use jobfence_domain::settlement::records::{PutSettlementSettings, QueueAmounts};
use jobfence_domain::settlement::ExceptionKind;
use jobfence_domain::DbTime;
use jobfence_store::PausePoint;
use kit::Harness;

/// The provider's second queue.
const EU: &str = "refunds-eu";

fn budget() -> Budget {
    Budget {
        rate_per_second: 1000.0,
        burst: 1000,
        max_in_flight: None,
        execute_cost: 1,
        reconcile_cost: 1,
        per_key: Default::default(),
    }
}

/// `provider` for `queues`, read with `mapping`, a lag of 0, amounts
/// compared at `/amount` and `/currency` in each queue.
async fn configure(h: &Harness, provider: &str, queues: &[&str], mapping: Mapping) {
    let store = h.coordinator.store();
    store
        .put_provider(&PutProvider {
            name: provider.into(),
            budget: budget(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            by: kit::settlement::by(),
        })
        .await
        .unwrap();
    store
        .put_settlement_settings(&PutSettlementSettings {
            provider: provider.into(),
            preset: None,
            mapping,
            lag: std::time::Duration::ZERO,
            queues: queues
                .iter()
                .map(|q| QueueAmounts {
                    queue: q.to_string(),
                    amount_pointer: Some("/amount".into()),
                    currency_pointer: Some("/currency".into()),
                })
                .collect(),
            by: kit::settlement::by(),
        })
        .await
        .unwrap();
}

/// `psp` for the queues `refunds` and `refunds-eu`.
async fn two_queues(h: &Harness) {
    configure(h, P, &[Q, EU], Mapping::fake()).await;
}

/// A job of `key` on `queue`, claimed by a worker (running).
async fn running(h: &Harness, queue: &str, key: &str) -> jobfence_api::v1::Job {
    h.enqueue(queue, key, &payload(500)).await;
    h.claim_one(queue, "w").await
}

/// A job of `key` on `queue`, failed by its worker with `disposition`.
async fn failed_on(h: &Harness, queue: &str, key: &str, disposition: FailDisposition) -> u64 {
    let job = running(h, queue, key).await;
    h.client
        .clone()
        .fail(FailRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            disposition: disposition as i32,
            error: "the provider said nothing clear".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
    job.job_id
}

/// The running `job` completed with `reference`.
async fn complete(h: &Harness, job: &jobfence_api::v1::Job, reference: &str) {
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            provider_reference: reference.into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
}

/// A job of `key` on `queue`, completed with `reference`.
async fn completed(h: &Harness, queue: &str, key: &str, reference: &str) -> u64 {
    let job = running(h, queue, key).await;
    complete(h, &job, reference).await;
    job.job_id
}

async fn state_of(h: &Harness, job_id: u64) -> String {
    sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM jobs WHERE id = ?")
        .bind(job_id)
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

/// `line` without its operation key (a refund made by hand, or a Stripe
/// refund without the metadata key).
fn keyless(n: u64, reference: &str) -> RawLine {
    let mut l = line(n, reference, "", 500, "succeeded");
    l.fields.remove("merchant_reference");
    l
}

/// The stored line of `reference`: its key and status.
async fn stored(h: &Harness, reference: &str) -> (Option<String>, String) {
    sqlx::query_as(
        "SELECT CAST(operation_key AS CHAR), CAST(status AS CHAR) FROM settlement_lines \
         WHERE provider_reference = ?",
    )
    .bind(reference)
    .fetch_one(&h.pool)
    .await
    .unwrap()
}

/// The details of the provider's exceptions not resolved.
async fn details(h: &Harness) -> Vec<String> {
    h.coordinator
        .settlement_exceptions(Some(P), &[], None, 100)
        .await
        .unwrap()
        .exceptions
        .into_iter()
        .map(|e| e.detail)
        .collect()
}

/// docs/settlement.md ("Set up a provider once") and design.md rule 15: a
/// refund without an operation key is matched by its id against the
/// provider reference recorded on a job *of the provider's queues*. A job
/// of another provider that recorded the same id is not this provider's
/// refund: the line is an UNKNOWN_REFERENCE under its reference, keeps no
/// key, and the other provider's job gets no settlement observation.
/// Guards a case no other test covers.
#[tokio::test]
async fn a_keyless_line_is_not_matched_to_a_job_of_another_provider() {
    let h = Harness::start().await;
    configure(&h, P, &[Q], Mapping::fake()).await;
    configure(&h, "other", &["other-refunds"], Mapping::fake()).await;
    let foreign = completed(&h, "other-refunds", "k-foreign", "re_shared").await;
    let summary = import(&h, &[keyless(2, "re_shared")]).await;
    assert_eq!(summary.decided.matched, 0, "{summary:?}");
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::UnknownReference, "re_shared".into())]
    );
    assert_eq!(stored(&h, "re_shared").await, (None, "succeeded".into()));
    let observed: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM job_observations WHERE job_id = ? AND source = 'settlement'",
    )
    .bind(foreign)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(observed, 0, "another provider's job is not touched");
    h.finish().await;
}

/// docs/settlement.md (the paragraph after the outcomes table): a key two
/// of the provider's queues hold is decided against the job whose
/// recorded provider reference is the settled refund's, and the other job
/// is left as it is; a line with no key takes the key of the job that
/// recorded its reference. Keyless, the refund is matched to the EU job
/// that recorded it and the other queue's manual review stays open.
/// Guards a case no other test covers (the existing test names the key).
#[tokio::test]
async fn a_keyless_refund_goes_to_the_queue_whose_job_recorded_it() {
    let h = Harness::start().await;
    two_queues(&h).await;
    let parked = failed_on(&h, Q, "k-two", FailDisposition::ManualReview).await;
    let done = completed(&h, EU, "k-two", "re_k-two").await;
    let summary = import(&h, &[keyless(2, "re_k-two")]).await;
    assert_eq!(summary.decided.matched, 1, "{summary:?}");
    assert!(summary.decided.resolved.is_empty(), "{summary:?}");
    assert_eq!(unresolved(&h).await, vec![]);
    assert_eq!(state_of(&h, parked).await, "manual_review");
    assert_eq!(state_of(&h, done).await, "succeeded");
    assert_eq!(
        stored(&h, "re_k-two").await,
        (Some("k-two".into()), "succeeded".into())
    );
    h.finish().await;
}

/// A key two of the provider's queues hold, which the refund decides
/// alike (both jobs failed): docs/settlement.md's table says it is
/// decided as for one job (one REFUND_NOT_RECORDED, no AMBIGUOUS_KEY) and
/// "its exceptions name each queue". Guards a case no other test covers.
#[tokio::test]
async fn a_key_two_queues_decide_alike_raises_one_exception_naming_each_queue() {
    let h = Harness::start().await;
    two_queues(&h).await;
    let a = failed_on(&h, Q, "k-alike", FailDisposition::Failed).await;
    let b = failed_on(&h, EU, "k-alike", FailDisposition::Failed).await;
    import(&h, &[line(2, "re_alike", "k-alike", 500, "succeeded")]).await;
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::RefundNotRecorded, "k-alike".into())]
    );
    let detail = &details(&h).await[0];
    for named in [
        format!("job {a} of queue {Q} (failed)"),
        format!("job {b} of queue {EU} (failed)"),
    ] {
        assert!(detail.contains(&named), "{detail}");
    }
    h.finish().await;
}

/// docs/settlement.md: refunds are matched against "the jobs of the
/// provider's queues (and the key records of pruned ones)", and a key two
/// of the provider's queues hold "is decided against the job whose
/// recorded provider reference is the settled refund's: its manual review
/// is resolved, or it is matched, and the other job is left as it is"
/// (design.md rule 15: "goes to the job that recorded the refund's
/// provider reference"). Here the EU job that recorded `re_k-pruned`
/// succeeded and was pruned (its key record holds the reference); the
/// same key waits in manual review in `refunds`.
///
/// Regression: `holders_on` (crates/store/src/settlement/on_insert.rs)
/// once read key records only for keys no job held in any queue, so the
/// EU key record was never seen and the refund resolved the `refunds`
/// job's review with the EU job's reference. A record now holds its key
/// in each queue where no job does.
#[tokio::test]
async fn a_pruned_job_that_recorded_the_refund_keeps_it_from_another_queues_review() {
    let h = Harness::start().await;
    two_queues(&h).await;
    let parked = failed_on(&h, Q, "k-pruned", FailDisposition::ManualReview).await;
    // The EU job of the key, succeeded with the refund's reference and
    // pruned: its key record (docs/design.md rule 14).
    sqlx::query(
        "INSERT INTO operation_keys (queue, operation_key, request_digest, job_id, final_state, \
         attempt, dispatch_count, provider_reference, created_at, finished_at, pruned_at) \
         VALUES (?, 'k-pruned', UNHEX(SHA2('k-pruned', 256)), 1000000, 'succeeded', 1, 1, \
         're_k-pruned', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .bind(EU)
    .execute(&h.pool)
    .await
    .unwrap();
    let summary = import(&h, &[line(2, "re_k-pruned", "k-pruned", 500, "succeeded")]).await;
    assert_eq!(
        state_of(&h, parked).await,
        "manual_review",
        "the refund the pruned EU job recorded resolved another queue's review: {summary:?}"
    );
    assert!(summary.decided.resolved.is_empty(), "{summary:?}");
    h.finish().await;
}

/// docs/settlement.md ("Work the exceptions"): "A later report that no
/// longer contradicts the job ... resolves the exception itself, recorded
/// as `settlement`". A keyless refund imported while its job still ran
/// (no reference recorded yet) is an UNKNOWN_REFERENCE; the worker then
/// completes with that reference, and the same report imported again
/// matches the line to the job by its reference.
///
/// Regression: the line was matched, but the UNKNOWN_REFERENCE, filed
/// under the refund's reference while it had no key, stayed open for
/// good: once the line had a key it was decided under the key only. It
/// is now resolved as the line is (`clear_unknown_references` in
/// crates/core/src/settlement/decide.rs).
#[tokio::test]
async fn an_unknown_reference_is_resolved_once_a_job_recorded_it() {
    let h = Harness::start().await;
    provider(&h).await;
    let job = running(&h, Q, "k-late").await;
    import(&h, &[keyless(2, "re_late")]).await;
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::UnknownReference, "re_late".into())]
    );
    complete(&h, &job, "re_late").await;
    let again = import(&h, &[keyless(2, "re_late")]).await;
    assert_eq!(again.decided.matched, 1, "{again:?}");
    assert_eq!(
        stored(&h, "re_late").await,
        (Some("k-late".into()), "succeeded".into())
    );
    assert_eq!(
        unresolved(&h).await,
        vec![],
        "the report now matches the refund to its job: {again:?}"
    );
    h.finish().await;
}

/// docs/settlement.md ("Bad input") and api.md (`ImportSettlement`): a
/// line whose column the settings read has no single value (`unreadable`:
/// a JSON array, a name given twice) is refused with its number and field
/// and "nothing of it written". Here the refused line is a later status of
/// a refund already stored as pending: the stored line stays pending. A
/// name the settings do not read being unreadable is no matter. Guards a
/// case no other test covers (the update path).
#[tokio::test]
async fn a_refused_line_leaves_a_stored_refund_as_it_was() {
    let h = Harness::start().await;
    provider(&h).await;
    succeeded(&h, "k-kept", 500).await;
    import(&h, &[line(2, "re_kept", "k-kept", 500, "pending")]).await;
    let mut twice = line(7, "re_kept", "k-kept", 500, "succeeded");
    twice.fields.remove("merchant_reference");
    twice.unreadable.insert(
        "merchant_reference".into(),
        "is given more than once in the line".into(),
    );
    let mut other = line(8, "re_other", "k-other", 500, "succeeded");
    other
        .unreadable
        .insert("tags".into(), "holds a JSON array, not one value".into());
    let summary = import(&h, &[twice, other]).await;
    assert_eq!(summary.lines_refused, 1, "{summary:?}");
    let r = &summary.refusals[0];
    assert_eq!((r.line, r.field), (7, "operation_key"), "{r:?}");
    assert_eq!(
        (summary.lines.new, summary.lines.updated),
        (1, 0),
        "{summary:?}"
    );
    assert_eq!(
        stored(&h, "re_kept").await,
        (Some("k-kept".into()), "pending".into())
    );
    h.finish().await;
}

/// Imports `lines` as `P`'s report of `period`.
async fn import_period(h: &Harness, period: (DbTime, DbTime), lines: &[RawLine]) -> ImportSummary {
    kit::settlement::import_period(&h.coordinator, P, period, lines).await
}

/// docs/settlement.md ("Import every report"): "Importing the same file
/// twice, or overlapping periods, changes nothing". The same report over a
/// period overlapping the first: its line unchanged, the succeeded job
/// with no refund still one MISSING_AT_PROVIDER, opened once, not again.
/// Guards a case no other test covers.
#[tokio::test]
async fn an_overlapping_period_changes_nothing() {
    let h = Harness::start().await;
    provider(&h).await;
    succeeded(&h, "k-here", 500).await;
    succeeded(&h, "k-gone", 500).await;
    let report = [line(2, "re_here", "k-here", 500, "succeeded")];
    let first = import_period(&h, until_now(), &report).await;
    assert_eq!(first.decided.exceptions_opened, 1, "{first:?}");
    let (start, end) = until_now();
    let overlapping = (start + chrono::Duration::days(1), end);
    let again = import_period(&h, overlapping, &report).await;
    assert_eq!(again.lines.unchanged, 1, "{again:?}");
    assert_eq!(again.decided.exceptions_opened, 0, "{again:?}");
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::MissingAtProvider, "k-gone".into())]
    );
    let actions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM settlement_exception_actions")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(actions, 1, "opened once, nothing else recorded");
    h.finish().await;
}

/// docs/settlement.md ("Import every report"): "Importing the same file
/// twice ... changes nothing", and the summary counts a line seen again
/// as it was "unchanged". A provider configured with `--created-format
/// rfc3339` whose export writes seven digits of a second (.NET's
/// round-trip format, `2025-12-01T10:00:00.1234567Z`).
///
/// Regression: the second import counted the refund "updated", rewrote
/// it and matched it again, every time: the mapping kept nanoseconds, the
/// column keeps microseconds. A report's time is now cut to the
/// microsecond as it is read (`time` in
/// crates/domain/src/settlement/mapping.rs).
#[tokio::test]
async fn the_same_report_with_sub_microsecond_times_imports_unchanged() {
    let h = Harness::start().await;
    let mapping = Mapping {
        created_format: TimeFormat::Rfc3339,
        ..Mapping::fake()
    };
    configure(&h, P, &[Q], mapping).await;
    succeeded(&h, "k-nanos", 500).await;
    let mut l = line(2, "re_nanos", "k-nanos", 500, "succeeded");
    l.fields
        .insert("created".into(), "2025-12-01T10:00:00.1234567Z".into());
    let first = import(&h, std::slice::from_ref(&l)).await;
    assert_eq!(
        (first.lines.new, first.decided.matched),
        (1, 1),
        "{first:?}"
    );
    let again = import(&h, std::slice::from_ref(&l)).await;
    assert_eq!(
        (again.lines.updated, again.lines.unchanged),
        (0, 1),
        "the same line imported again: {again:?}"
    );
    h.finish().await;
}

/// `P`'s report of every job so far, imported on a task of its own (to
/// be paused).
fn spawn_import(h: &Harness, lines: Vec<RawLine>) -> tokio::task::JoinHandle<ImportSummary> {
    let c = h.coordinator.clone();
    tokio::spawn(async move { kit::settlement::import(&c, P, &lines).await })
}

/// docs/settlement.md ("Import every report"): a refund seen again with a
/// new status "is updated and its key matched again"; imports of one
/// provider at once take turns on a key's finished job, "and the second
/// sees the first's line". Yesterday's report (the refund pending) and
/// today's (it succeeded) are imported at once; yesterday's batch holds
/// the job's lock, today's waits for it, then goes on. Taking turns, the
/// end must be that of the two in that order: the refund succeeded,
/// matched, no exception.
///
/// Regression: today's batch read the lines before yesterday's committed
/// (a locking read that in READ COMMITTED locks no gap), counted the
/// refund new, and its insert (then `ON DUPLICATE KEY UPDATE id = id`)
/// dropped it: the refund stayed pending, a critical MISSING_AT_PROVIDER
/// open. The duplicate key is now a conflict: the batch runs again,
/// counted, and updates the line (`put_lines_in` in
/// crates/store/src/settlement/lines.rs).
#[tokio::test]
async fn two_reports_of_one_refund_imported_at_once_keep_the_later_status() {
    let h = Harness::start().await;
    provider(&h).await;
    succeeded(&h, "k-race", 500).await;
    let mut gate = h.pauses.arm(PausePoint::SettlementBeforeInsert);
    let yesterday = spawn_import(&h, vec![line(2, "re_k-race", "k-race", 500, "pending")]);
    gate.reached().await;
    let today = spawn_import(&h, vec![line(2, "re_k-race", "k-race", 500, "succeeded")]);
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    gate.release();
    let yesterday = yesterday.await.unwrap();
    let today = today.await.unwrap();
    // Today's batch ran again once, counted.
    assert_eq!(h.coordinator.store().conflicts(), (1, 0));
    assert_eq!(
        stored(&h, "re_k-race").await,
        (Some("k-race".into()), "succeeded".into()),
        "today's status was lost: {yesterday:?} {today:?}"
    );
    assert_eq!(unresolved(&h).await, vec![], "{today:?}");
    h.finish().await;
}

/// `jobfence settlement ARGS…` as the operator `alice`: what it printed.
async fn cli(s: &kit::secure::Secure, args: &[&str]) -> String {
    let argv: Vec<&str> = ["settlement"].iter().chain(args).copied().collect();
    let (printed, done) = crate::operator_cli::run_as(s, "alice", &argv).await;
    done.unwrap();
    printed
}

/// Imports `n` refunds nobody enqueued (`re_<from>`…): an
/// UNKNOWN_REFERENCE each.
async fn unknown_refunds(s: &kit::secure::Secure, from: usize, n: usize) {
    use std::io::Write;
    let mut csv = b"id,merchant_reference,amount,currency,status,created\n".to_vec();
    for i in from..from + n {
        writeln!(csv, "re_{i},key-{i},500,usd,succeeded,1764547200").unwrap();
    }
    let file = std::env::temp_dir().join(format!(
        "jobfence-settlement-edges-{}-{from}.csv",
        std::process::id()
    ));
    std::fs::write(&file, csv).unwrap();
    let file = file.display().to_string();
    cli(
        s,
        &["import", "--provider", P, "--period", "2025-12-01", &file],
    )
    .await;
    std::fs::remove_file(&file).unwrap();
}

/// `exceptions --json ARGS…`: (shown, total, cut).
async fn listed(s: &kit::secure::Secure, args: &[&str]) -> (u64, u64, Option<String>) {
    let argv: Vec<&str> = ["exceptions", "--json"]
        .iter()
        .chain(args)
        .copied()
        .collect();
    let v: serde_json::Value = serde_json::from_str(&cli(s, &argv).await).unwrap();
    assert_eq!(
        v["exceptions"].as_array().unwrap().len() as u64,
        v["shown"].as_u64().unwrap()
    );
    (
        v["shown"].as_u64().unwrap(),
        v["total"].as_u64().unwrap(),
        v["cut"].as_str().map(str::to_owned),
    )
}

/// docs/settlement.md ("Work the exceptions") and operating.md: a list
/// shows 100; "a list the limit cut ends with what it left out", and
/// `cut` is null "when nothing was left out"; `--limit 0` shows up to
/// 500. At exactly 100 nothing is cut or said; at 101 the default list
/// is cut and says so; `--limit 0` then shows all 101 (a boundary guard).
#[tokio::test]
async fn an_exceptions_list_is_cut_only_past_its_limit() {
    let s = kit::secure::Secure::start(false).await;
    crate::settlement::provider_on(s.coordinator.store(), false).await;
    unknown_refunds(&s, 0, 100).await;
    assert_eq!(listed(&s, &[]).await, (100, 100, None));
    let text = cli(&s, &["exceptions"]).await;
    assert!(!text.contains("showing"), "{text}");
    unknown_refunds(&s, 100, 1).await;
    let (shown, total, cut) = listed(&s, &[]).await;
    assert_eq!((shown, total), (100, 101));
    let cut = cut.expect("a list cut at 100 says so");
    assert!(
        cut.starts_with("showing 100 of 101; --limit 500 (or 0)"),
        "{cut}"
    );
    let text = cli(&s, &["exceptions"]).await;
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("showing 100 of 101"),
        "{text}"
    );
    assert_eq!(listed(&s, &["--limit", "0"]).await, (101, 101, None));
    s.stop().await;
}
