//! What an import takes before its lines (docs/settlement.md, "Bad
//! input"): a period that has ended and begins after 2000, a header row
//! naming every column the provider's settings read, and at least one line
//! taken unless the operator says the provider refunded nothing. Each refusal
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
    let ended = start(&h, (day("2000-01-01"), now()), true)
        .await
        .expect("a period ended now is taken");
    ended.finish().await.unwrap();
    assert_eq!(periods(&h).await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_header_row_without_a_column_the_settings_read_is_refused_before_any_line() {
    let h = Harness::start().await;
    provider(&h).await;
    let columns = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
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

    let allowed = start(&h, (day("2026-11-01"), day("2026-11-02")), true)
        .await
        .unwrap();
    let summary = allowed.finish().await.unwrap();
    assert_eq!(summary.lines_read, 0);
    assert_eq!(
        periods(&h).await,
        1,
        "allowed, the empty report covers its day"
    );
    h.finish().await;
}
