//! What an import takes before its lines (docs/settlement.md, "Bad
//! input"): a period that has ended and begins after 2000, a header row
//! naming every column the provider's settings read, once, and at least
//! one line taken unless the operator says the provider refunded nothing
//! and the report's header row shows it is the provider's export (every
//! column named, the operation key's too). Each refusal
//! records no period: a covered period is where succeeded jobs with no
//! refund are looked for (MISSING_AT_PROVIDER, critical).

use jobfence_testkit as kit;

use crate::settlement::{day, line, provider, P};
use jobfence_core::settlement::ImportHeader;
use jobfence_domain::{CoordinatorError, DbTime};
use kit::Harness;

fn header(period: (DbTime, DbTime), allow_empty: bool) -> ImportHeader {
    ImportHeader {
        provider: P.into(),
        period,
        operator: "alice".into(),
        check_only: false,
        allow_empty,
    }
}

/// Starts an import of the provider's report of `period` by `alice`.
async fn start(
    h: &Harness,
    period: (DbTime, DbTime),
    allow_empty: bool,
) -> Result<jobfence_core::settlement::Import, CoordinatorError> {
    h.coordinator
        .start_import(header(period, allow_empty))
        .await
}

fn fields_of(e: CoordinatorError) -> Vec<String> {
    match e {
        CoordinatorError::InvalidArgument(v) => v.into_iter().map(|f| f.field).collect(),
        other => panic!("refused with {other:?}"),
    }
}

async fn periods(h: &Harness) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM settlement_periods")
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

/// The fake provider's columns (its preset's).
const FAKE: [&str; 6] = [
    "id",
    "merchant_reference",
    "amount",
    "currency",
    "status",
    "created",
];

fn columns(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn now() -> DbTime {
    chrono::Utc::now().naive_utc()
}

#[tokio::test]
async fn a_report_covers_only_a_period_that_has_ended_and_began_after_2000() {
    let h = Harness::start().await;
    provider(&h).await;
    let future = start(
        &h,
        (day("2026-01-01"), now() + chrono::Duration::hours(1)),
        true,
    )
    .await
    .err()
    .expect("a period not yet ended is refused");
    assert_eq!(fields_of(future), ["period_end"]);
    let early = start(&h, (day("1999-12-31"), day("2000-01-02")), true)
        .await
        .err()
        .expect("a period before 2000 is refused");
    assert_eq!(fields_of(early), ["period_start"]);
    let mut ended = start(&h, (day("2000-01-01"), now()), true)
        .await
        .expect("a period ended now is taken");
    ended.columns(&columns(&FAKE)).unwrap();
    ended.finish().await.unwrap();
    assert_eq!(periods(&h).await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_header_row_without_a_column_the_settings_read_is_refused_before_any_line() {
    let h = Harness::start().await;
    provider(&h).await;
    let mut wrong = start(&h, (day("2000-01-01"), now()), true).await.unwrap();
    // The fake provider's columns but `amount` and `status`; no line follows.
    let refused = wrong
        .columns(&columns(&[
            "id",
            "merchant_reference",
            "currency",
            "created",
        ]))
        .unwrap_err();
    assert_eq!(fields_of(refused), ["columns.amount", "columns.status"]);
    drop(wrong);
    assert_eq!(periods(&h).await, 0, "the refused import covers nothing");

    // Every column named: a line that lacks one is then refused alone, even
    // as the batch's only line, and the import goes on.
    let mut right = start(&h, (day("2000-01-01"), now()), false).await.unwrap();
    right
        .columns(&columns(&[
            "id",
            "merchant_reference",
            "amount",
            "currency",
            "status",
            "created",
        ]))
        .unwrap();
    let mut short = line(2, "re_short", "key-short", 500, "succeeded");
    short.fields.remove("created");
    right.lines(&[short]).await.unwrap();
    right
        .lines(&[line(3, "re_whole", "key-whole", 500, "succeeded")])
        .await
        .unwrap();
    let summary = right.finish().await.unwrap();
    assert_eq!((summary.lines_read, summary.lines_refused), (2, 1));
    assert_eq!(summary.refusals[0].line, 2);
    assert_eq!(summary.refusals[0].field, "created");
    assert_eq!(summary.lines.new, 1);
    assert_eq!(periods(&h).await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_report_with_no_line_or_only_refused_ones_covers_nothing_unless_the_operator_allows_it() {
    let h = Harness::start().await;
    provider(&h).await;
    let empty = start(&h, (day("2026-11-01"), day("2026-11-02")), false)
        .await
        .unwrap();
    let refused = empty.finish().await.unwrap_err();
    assert_eq!(fields_of(refused), ["lines"]);
    assert_eq!(periods(&h).await, 0, "an empty report covers nothing");

    // Nor does one whose every line was refused: it lists no refund that
    // can be trusted.
    let mut broken = start(&h, (day("2026-11-01"), day("2026-11-02")), false)
        .await
        .unwrap();
    broken
        .lines(&[line(2, "re_zero", "key-zero", 0, "succeeded")])
        .await
        .unwrap();
    let refused = broken.finish().await.unwrap_err();
    assert_eq!(fields_of(refused), ["lines"]);
    assert_eq!(
        periods(&h).await,
        0,
        "a report of refused lines covers nothing"
    );

    // Allowed, an empty report with no header row still covers nothing:
    // nothing tells it from a failed download.
    let headless = start(&h, (day("2026-11-01"), day("2026-11-02")), true)
        .await
        .unwrap();
    let refused = headless.finish().await.unwrap_err();
    assert!(refused.to_string().contains("no header row"), "{refused}");
    assert_eq!(
        periods(&h).await,
        0,
        "an empty report with no header row covers nothing"
    );

    // Nor a report of refused lines, allowed or not.
    let mut broken = start(&h, (day("2026-11-01"), day("2026-11-02")), true)
        .await
        .unwrap();
    broken.columns(&columns(&FAKE)).unwrap();
    broken
        .lines(&[line(2, "re_zero", "key-zero", 0, "succeeded")])
        .await
        .unwrap();
    let refused = broken.finish().await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("never one whose lines were all refused"),
        "{refused}"
    );
    assert_eq!(periods(&h).await, 0, "allowed, refused lines cover nothing");

    // A header row that lacks the operation key's column is taken with
    // lines (each matched by its reference), but an empty report must
    // name every column.
    let mut keyless = start(&h, (day("2026-11-01"), day("2026-11-02")), true)
        .await
        .unwrap();
    let without_key: Vec<&str> = FAKE
        .iter()
        .copied()
        .filter(|c| *c != "merchant_reference")
        .collect();
    keyless.columns(&columns(&without_key)).unwrap();
    let refused = keyless.finish().await.unwrap_err();
    assert!(
        refused.to_string().contains("\"merchant_reference\""),
        "{refused}"
    );
    assert_eq!(fields_of(refused), ["columns.operation_key"]);
    assert_eq!(periods(&h).await, 0);

    let mut allowed = start(&h, (day("2026-11-01"), day("2026-11-02")), true)
        .await
        .unwrap();
    allowed.columns(&columns(&FAKE)).unwrap();
    let summary = allowed.finish().await.unwrap();
    assert_eq!(summary.lines_read, 0);
    assert_eq!(
        periods(&h).await,
        1,
        "allowed, the empty report whose header row names every column covers its day"
    );
    h.finish().await;
}

/// A header row that names one of the settings' columns twice is refused
/// by that column: which of the two holds the field cannot be told.
#[tokio::test]
async fn a_header_row_naming_a_column_twice_is_refused() {
    let h = Harness::start().await;
    provider(&h).await;
    let mut twice = start(&h, (day("2000-01-01"), now()), false).await.unwrap();
    let mut names = FAKE.to_vec();
    names.push("amount");
    let refused = twice.columns(&columns(&names)).unwrap_err();
    assert!(refused.to_string().contains("2 times"), "{refused}");
    assert_eq!(fields_of(refused), ["columns.amount"]);
    h.finish().await;
}
