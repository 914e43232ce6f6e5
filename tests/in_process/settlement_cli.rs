//! `jobfence settlement import` as an operator runs it (docs/settlement.md),
//! against a coordinator with TLS and the callers file: a
//! report that cannot be read to its end cancels the import (no period
//! recorded) and the whole file imported again ends as one clean import;
//! `--strict` refuses standard input, which it could read only once; a
//! report of wide lines goes in batches under the coordinator's request
//! limit, and a line too wide is refused with its number (the command
//! then ends with status 1, the rest imported); `--max-rate`
//! paces the lines sent; a refused period, and a refused read, name the
//! flags they came from.

use jobfence_testkit as kit;

use crate::settlement::{provider_on, P};
use clap::Parser;
use jobfence_operator::{Cli, Operation};
use kit::secure::Secure;
use std::io::Write;
use std::path::Path;

/// Runs `jobfence settlement ARGS…` as the operator `alice`; what it
/// printed, or its error text (with its causes).
async fn settlement(s: &Secure, args: &[&str]) -> Result<String, String> {
    let (out, ended) = settlement_output(s, args).await;
    ended.map(|()| out)
}

/// `jobfence settlement ARGS` as alice: what it wrote, and how it ended.
async fn settlement_output(s: &Secure, args: &[&str]) -> (String, Result<(), String>) {
    let endpoint = format!("https://{}", s.addr);
    let ca = s.files.ca.display().to_string();
    let token = s.files.token("alice").display().to_string();
    let mut argv = vec!["jobfence", "settlement", args[0]];
    argv.extend_from_slice(&["--endpoint", &endpoint, "--tls-ca", &ca]);
    argv.extend_from_slice(&["--token-file", &token]);
    argv.extend_from_slice(&args[1..]);
    let parsed = match Cli::try_parse_from(argv) {
        Ok(parsed) => parsed,
        Err(e) => return (String::new(), Err(e.to_string())),
    };
    let op @ Operation::Settlement(_) = parsed.command else {
        panic!("not a settlement command");
    };
    let mut out = Vec::new();
    let ended = jobfence_operator::run(op, &mut out)
        .await
        .map_err(|e| format!("{e:#}"));
    (String::from_utf8(out).unwrap(), ended)
}

async fn configure(s: &Secure) {
    provider_on(s.coordinator.store(), false).await;
}

/// A fake-provider CSV of `n` refunds nobody enqueued (`extra`: a column
/// of that many bytes on every line).
fn report(n: usize, extra: usize) -> Vec<u8> {
    let mut csv = b"id,merchant_reference,amount,currency,status,created,note\n".to_vec();
    let note = "x".repeat(extra);
    for i in 0..n {
        writeln!(csv, "re_{i},key-{i},500,usd,succeeded,1764547200,{note}").unwrap();
    }
    csv
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

async fn counts(s: &Secure) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM settlement_periods), (SELECT COUNT(*) FROM settlement_lines)",
    )
    .fetch_one(&s.pool)
    .await
    .unwrap()
}

/// A directory of this test process's own, emptied.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "jobfence-settlement-cli-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn path(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

#[tokio::test]
async fn a_report_cut_short_cancels_the_import_and_the_whole_file_imports_cleanly() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let dir = scratch("cut");
    let whole = gzip(&report(3000, 0));
    let cut = path(&dir, "cut.csv.gz", &whole[..whole.len() / 2]);
    let args = ["import", "--provider", P, "--period", "2025-12-01"];
    let failed = settlement(&s, &[&args[..], &[cut.as_str()]].concat())
        .await
        .unwrap_err();
    assert!(failed.contains("could not be read to its end"), "{failed}");
    let (periods, _) = counts(&s).await;
    assert_eq!(periods, 0, "a cut import records no period");

    let file = path(&dir, "whole.csv.gz", &whole);
    let done = settlement(&s, &[&args[..], &[file.as_str(), "--json"]].concat())
        .await
        .unwrap();
    let summary: serde_json::Value = serde_json::from_str(&done).unwrap();
    assert_eq!(summary["lines_read"], 3000, "{summary}");
    assert_eq!(counts(&s).await, (1, 3000));
    s.stop().await;
}

#[tokio::test]
async fn strict_refuses_standard_input() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let refused = settlement(
        &s,
        &[
            "import",
            "--provider",
            P,
            "--period",
            "2025-12-01",
            "--strict",
        ]
        .into_iter()
        .chain(["--format", "csv", "-"])
        .collect::<Vec<_>>(),
    )
    .await
    .unwrap_err();
    assert!(
        refused.contains("standard input can be read once"),
        "{refused}"
    );
    assert_eq!(counts(&s).await, (0, 0));
    s.stop().await;
}

#[tokio::test]
async fn wide_lines_go_in_batches_under_the_request_limit_and_one_too_wide_is_refused() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let dir = scratch("wide");
    // 500 lines of 10 KB: 5 MB, over the 4 MiB a message may carry.
    let mut csv = report(500, 10_000);
    writeln!(
        csv,
        "re_wide,key-wide,500,usd,succeeded,1764547200,{}",
        "y".repeat(300_000)
    )
    .unwrap();
    let file = path(&dir, "wide.csv", &csv);
    let args = [
        "import",
        "--provider",
        P,
        "--period",
        "2025-12-01",
        "--json",
    ];
    let (done, ended) = settlement_output(&s, &[&args[..], &[file.as_str()]].concat()).await;
    let ended = ended.expect_err("a refused line ends the command with status 1");
    assert!(ended.starts_with("1 line(s) refused"), "{ended}");
    let summary: serde_json::Value = serde_json::from_str(&done).unwrap();
    assert_eq!(summary["lines_new"], 500, "{summary}");
    let refused = summary["refused"].to_string();
    assert!(
        refused.contains("502"),
        "the wide line, by its number: {summary}"
    );
    assert_eq!(counts(&s).await, (1, 500));
    s.stop().await;
}

/// `--max-rate` paces the lines sent: at 100 a second, the command waits
/// after its first batch of 2000 until those lines are due (20 s), so 2001
/// lines cannot be done in under 20 s, where the same file unpaced takes
/// about 3 s in a debug build; every line is imported.
/// Only a lower bound is asserted: the pacing sleeps, so no machine is too
/// fast for it.
#[tokio::test]
async fn max_rate_paces_the_import_and_imports_every_line() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let dir = scratch("paced");
    let file = path(&dir, "paced.csv", &report(2001, 0));
    let args = ["import", "--provider", P, "--period", "2025-12-01"];
    let started = std::time::Instant::now();
    let done = settlement(
        &s,
        &[&args[..], &["--max-rate", "100", "--json", file.as_str()]].concat(),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    let summary: serde_json::Value = serde_json::from_str(&done).unwrap();
    assert_eq!(summary["lines_new"], 2001, "{summary}");
    assert!(
        took >= std::time::Duration::from_secs(20),
        "2001 lines at 100/s were sent in {took:?}"
    );
    assert_eq!(counts(&s).await, (1, 2001));
    s.stop().await;
}

/// `settlement exceptions` from the command line: the list (JSON), then
/// `ack` and `resolve` of one exception as alice, each recorded; an `ack`
/// of an exception already resolved is refused with its state.
#[tokio::test]
async fn exceptions_are_listed_acknowledged_and_resolved_from_the_command_line() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let dir = scratch("exceptions");
    // Refunds nobody enqueued: an UNKNOWN_REFERENCE each.
    let file = path(&dir, "two.csv", &report(2, 0));
    let args = ["import", "--provider", P, "--period", "2025-12-01"];
    settlement(&s, &[&args[..], &[file.as_str()]].concat())
        .await
        .unwrap();
    let listed = settlement(&s, &["exceptions", "--json"]).await.unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(
        (&listed["shown"], &listed["total"]),
        (&2.into(), &2.into()),
        "{listed}"
    );
    assert!(listed["cut"].is_null(), "{listed}");
    let listed = &listed["exceptions"];
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(listed[0]["kind"], "UNKNOWN_REFERENCE");
    let id = listed[0]["id"].as_u64().unwrap().to_string();
    let acked = settlement(
        &s,
        &[
            "exceptions",
            "ack",
            &id,
            "--note",
            "asked the PSP",
            "--json",
        ],
    )
    .await
    .unwrap();
    assert!(acked.contains(r#""state": "acknowledged""#), "{acked}");
    let resolved = settlement(
        &s,
        &[
            "exceptions",
            "resolve",
            &id,
            "--note",
            "a test refund",
            "--json",
        ],
    )
    .await
    .unwrap();
    assert!(resolved.contains(r#""state": "resolved""#), "{resolved}");
    let actions: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(action AS CHAR), CAST(operator AS CHAR) FROM settlement_exception_actions \
         WHERE exception_id = ? ORDER BY id",
    )
    .bind(listed[0]["id"].as_u64().unwrap())
    .fetch_all(&s.pool)
    .await
    .unwrap();
    assert_eq!(
        actions,
        [
            ("opened".to_owned(), "settlement".to_owned()),
            ("acknowledged".to_owned(), "alice".to_owned()),
            ("resolved".to_owned(), "alice".to_owned())
        ]
    );
    let again = settlement(&s, &["exceptions", "ack", &id, "--note", "late"])
        .await
        .unwrap_err();
    assert!(again.contains("is resolved already"), "{again}");
    let left = settlement(&s, &["exceptions", "--json"]).await.unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&left).unwrap()["exceptions"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    s.stop().await;
}

/// `settlement report` for cron: a success while nothing critical is open;
/// exit status 1 while a REFUND_NOT_RECORDED is open (a refund of a job
/// an operator cancelled), and again a success once it is resolved; exit
/// status 2 when the report cannot be read at all (no coordinator), never
/// the 1 that means "money moved that jobfence says did not".
#[tokio::test]
async fn the_report_exits_1_while_a_critical_exception_is_open_and_2_when_it_cannot_tell() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let live = format!("https://{}", s.addr);
    let (done, text) = report_from(&s, &live).await;
    assert!(done.is_ok(), "{done:?}");
    assert!(text.contains(P), "{text}");

    // A job cancelled before it was sent, and the provider's refund of it.
    let payload = ["--payload", "{}"];
    let enqueue = [
        "enqueue",
        "--queue",
        crate::settlement::Q,
        "--key",
        "key-cancelled",
    ];
    crate::jobs_cli::jobs(&s, "shop", &[&enqueue[..], &payload[..]].concat())
        .await
        .unwrap();
    let cancel = ["cancel", "1", "--reason", "withdrawn by the customer"];
    crate::jobs_cli::jobs(&s, "alice", &cancel).await.unwrap();
    let dir = scratch("report-exit");
    let refund = "id,merchant_reference,amount,currency,status,created\n\
                  re_1,key-cancelled,500,usd,succeeded,1764547200\n";
    let file = path(&dir, "refund.csv", refund.as_bytes());
    let args = ["import", "--provider", P, "--period", "2025-12-01"];
    settlement(&s, &[&args[..], &[file.as_str()]].concat())
        .await
        .unwrap();
    let (done, text) = report_from(&s, &live).await;
    let err = done.unwrap_err();
    assert_eq!(jobfence_operator::exit_status(&err), 1, "{err:#}");
    assert!(format!("{err:#}").contains("1 critical"), "{err:#}");
    assert!(text.contains("REFUND_NOT_RECORDED"), "{text}");

    let listed = settlement(&s, &["exceptions", "--json"]).await.unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let listed = &listed["exceptions"];
    assert_eq!(listed[0]["kind"], "REFUND_NOT_RECORDED", "{listed}");
    let id = listed[0]["id"].as_u64().unwrap().to_string();
    let resolve = ["exceptions", "resolve", id.as_str()];
    let note = ["--note", "the PSP reversed the refund"];
    settlement(&s, &[&resolve[..], &note[..]].concat())
        .await
        .unwrap();
    let (done, _) = report_from(&s, &live).await;
    assert!(done.is_ok(), "{done:?}");

    let (done, _) = report_from(&s, "https://127.0.0.1:1").await;
    let err = done.unwrap_err();
    assert_eq!(jobfence_operator::exit_status(&err), 2, "{err:#}");
    assert!(
        format!("{err:#}").starts_with("no settlement report: "),
        "{err:#}"
    );
    s.stop().await;
}

/// `jobfence settlement report` as alice against `endpoint`: how it ended,
/// and what it printed.
async fn report_from(s: &Secure, endpoint: &str) -> (anyhow::Result<()>, String) {
    let ca = s.files.ca.display().to_string();
    let token = s.files.token("alice").display().to_string();
    let argv = [
        "jobfence",
        "settlement",
        "report",
        "--endpoint",
        endpoint,
        "--tls-ca",
        &ca,
        "--token-file",
        &token,
    ];
    let op = Cli::try_parse_from(argv).unwrap().command;
    let mut out = Vec::new();
    let done = jobfence_operator::run(op, &mut out).await;
    (done, String::from_utf8(out).unwrap())
}

/// A report with no line covers nothing unless `--allow-empty` says the
/// provider refunded nothing in the period and its header row names every
/// column of the provider's settings: an empty file has no header row at
/// all (nor has an empty file of JSON lines), a header row without a
/// column the settings read is refused by that column, and a header row
/// alone is an empty report. A file whose lines were all refused is not
/// one.
#[tokio::test]
async fn an_empty_report_or_a_header_row_short_of_a_column_covers_nothing() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let dir = scratch("empty");
    let args = [
        "import",
        "--provider",
        P,
        "--period",
        "2025-12-01",
        "--json",
    ];
    let import = |file: String, more: &'static [&'static str]| {
        let argv: Vec<String> = args
            .iter()
            .chain(more)
            .map(|a| a.to_string())
            .chain([file])
            .collect();
        let s = &s;
        async move {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            settlement(s, &argv).await
        }
    };
    let nothing = path(&dir, "nothing.csv", b"");
    let refused = import(nothing.clone(), &["--allow-empty"])
        .await
        .unwrap_err();
    assert!(refused.contains("no header row"), "{refused}");
    let short = path(
        &dir,
        "short.csv",
        b"id,merchant_reference,currency,status,created\n",
    );
    let refused = import(short, &["--allow-empty"]).await.unwrap_err();
    assert!(refused.contains("columns.amount"), "{refused}");
    assert!(refused.contains("\"amount\""), "{refused}");
    // A header row alone must name the operation key's column too: it is
    // all that shows the file is the provider's export.
    let keyless = path(&dir, "keyless.csv", b"id,amount,currency,status,created\n");
    let refused = import(keyless, &["--allow-empty"]).await.unwrap_err();
    assert!(refused.contains("columns.operation_key"), "{refused}");
    assert!(refused.contains("\"merchant_reference\""), "{refused}");
    // JSON lines have no header row: an empty file is refused, and says
    // which header row would cover the day.
    let empty_json = path(&dir, "nothing.jsonl", b"\n\n");
    let refused = import(empty_json, &["--allow-empty"]).await.unwrap_err();
    assert!(refused.contains("no header row"), "{refused}");
    assert!(
        refused.contains("id,merchant_reference,amount,currency,status,created"),
        "{refused}"
    );
    // Lines every one of which is refused, here or by the coordinator, are
    // no empty report.
    let not_json = path(&dir, "broken.jsonl", b"not json\n[1]\n");
    let refused = import(not_json, &["--allow-empty"]).await.unwrap_err();
    assert!(
        refused.contains("every one of the report's 2 lines was refused (line 1: line: not JSON"),
        "{refused}"
    );
    let all_bad = path(
        &dir,
        "all-bad.csv",
        b"id,merchant_reference,amount,currency,status,created\nre_1,k1,12a,usd,succeeded,1764547200\n",
    );
    let refused = import(all_bad, &["--allow-empty"]).await.unwrap_err();
    assert!(refused.contains("lines were all refused"), "{refused}");
    let header_only = path(
        &dir,
        "header-only.csv",
        b"id,merchant_reference,amount,currency,status,created\n",
    );
    let refused = import(header_only.clone(), &[]).await.unwrap_err();
    assert!(refused.contains("--allow-empty"), "{refused}");
    assert_eq!(counts(&s).await, (0, 0), "nothing refused covers a period");
    let done = import(header_only, &["--allow-empty"]).await.unwrap();
    let summary: serde_json::Value = serde_json::from_str(&done).unwrap();
    assert_eq!(summary["lines_read"], 0, "{summary}");
    assert_eq!(counts(&s).await, (1, 0), "the empty report covers its day");
    s.stop().await;
}

/// A period refused names the flag it was given with: `--period` for a
/// day, `--from`/`--to` otherwise; a period that ends before it starts,
/// and a day that is not one, are refused before anything is sent.
#[tokio::test]
async fn a_refused_period_names_the_flag_it_came_from() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let dir = scratch("period-flags");
    let file = path(&dir, "one.csv", &report(1, 0));
    let import = |more: &[&str]| {
        let argv: Vec<String> = ["import", "--provider", P]
            .iter()
            .chain(more)
            .map(|a| a.to_string())
            .chain([file.clone()])
            .collect();
        let s = &s;
        async move {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            settlement(s, &argv).await.unwrap_err()
        }
    };
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string();
    let refused = import(&["--period", &tomorrow]).await;
    assert!(refused.contains("period_end (--period)"), "{refused}");
    let refused = import(&["--from", "2026-01-01", "--to", &tomorrow]).await;
    assert!(refused.contains("period_end (--to)"), "{refused}");
    let refused = import(&["--from", "2026-12-03", "--to", "2026-12-02"]).await;
    assert!(refused.contains("--to must be after --from"), "{refused}");
    let refused = import(&["--period", "2026-13-01"]).await;
    assert!(refused.contains("YYYY-MM-DD"), "{refused}");
    assert_eq!(counts(&s).await, (0, 0), "nothing refused covers a period");
    s.stop().await;
}

/// A read refused for its filters names each by its flag, and does not
/// say that nothing was written (it writes nothing anyway).
#[tokio::test]
async fn a_refused_read_names_its_flags() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let refused = settlement(&s, &["exceptions", "--state", "bogus"])
        .await
        .unwrap_err();
    assert!(refused.contains("states[0] (--state)"), "{refused}");
    assert!(!refused.contains("nothing was written"), "{refused}");
    let refused = settlement(&s, &["report", "--provider", "nope"])
        .await
        .unwrap_err();
    assert!(refused.contains("provider (--provider)"), "{refused}");
    s.stop().await;
}

/// An unknown preset is refused by its flag alone: the columns it would
/// have given are not refused one by one after it.
#[tokio::test]
async fn an_unknown_preset_is_refused_alone() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let refused = settlement(
        &s,
        &[
            "configure",
            "--provider",
            P,
            "--preset",
            "bogus",
            "--reason",
            "trying",
        ],
    )
    .await
    .unwrap_err();
    assert!(refused.contains("preset (--preset)"), "{refused}");
    assert!(!refused.contains("columns."), "{refused}");
    s.stop().await;
}

/// A JSON line that gives a column of the provider's settings no single
/// value is refused by its number and the field, never read with one of
/// its values picked: an array, an object, a dotted key and a nested one
/// for the same name (`{"metadata.operation_key": …, "metadata":
/// {"operation_key": …}}`), one key twice. An array or a name given twice
/// that the settings do not read is no matter.
#[tokio::test]
async fn a_json_line_giving_a_column_no_single_value_is_refused_by_its_number() {
    use jobfence_domain::settlement::mapping::Mapping;
    use jobfence_domain::settlement::records::PutSettlementSettings;
    let s = Secure::start(false).await;
    configure(&s).await;
    s.coordinator
        .store()
        .put_settlement_settings(&PutSettlementSettings {
            provider: P.into(),
            preset: Some("stripe".into()),
            mapping: Mapping::stripe(),
            lag: std::time::Duration::ZERO,
            queues: vec![],
            by: jobfence_testkit::settlement::by(),
        })
        .await
        .unwrap();
    let rest = r#""currency":"usd","status":"succeeded","created":1764547200"#;
    let lines = [
        format!(r#"{{"id":"re_ok","metadata":{{"operation_key":"k-ok"}},"amount":500,{rest}}}"#),
        format!(
            r#"{{"id":"re_arr","metadata":{{"operation_key":["k1","k2"]}},"amount":500,{rest}}}"#
        ),
        format!(
            r#"{{"id":"re_two","metadata.operation_key":"k1","metadata":{{"operation_key":"k2"}},"amount":500,{rest}}}"#
        ),
        format!(
            r#"{{"id":"re_dup","metadata":{{"operation_key":"k3"}},"amount":500,"amount":700,{rest}}}"#
        ),
        format!(
            r#"{{"id":"re_obj","metadata":{{"operation_key":{{"k":"v"}}}},"amount":500,{rest}}}"#
        ),
        format!(
            r#"{{"id":"re_tags","tags":[1,2],"x.y":1,"x":{{"y":2}},"metadata":{{"operation_key":"k-tags"}},"amount":500,{rest}}}"#
        ),
    ];
    let dir = scratch("json-values");
    let file = path(&dir, "refunds.jsonl", lines.join("\n").as_bytes());
    let args = [
        "import",
        "--provider",
        P,
        "--period",
        "2025-12-01",
        "--json",
    ];
    let (done, ended) = settlement_output(&s, &[&args[..], &[file.as_str()]].concat()).await;
    let ended = ended.expect_err("refused lines end the command with status 1");
    assert!(ended.starts_with("4 line(s) refused"), "{ended}");
    let summary: serde_json::Value = serde_json::from_str(&done).unwrap();
    assert_eq!(summary["lines_new"], 2, "{summary}");
    let refused: Vec<(u64, String, String)> = summary["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["line"].as_u64().unwrap(),
                r["field"].as_str().unwrap().to_owned(),
                r["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let fields: Vec<(u64, &str)> = refused.iter().map(|(n, f, _)| (*n, f.as_str())).collect();
    assert_eq!(
        fields,
        [
            (2, "operation_key"),
            (3, "operation_key"),
            (4, "amount"),
            (5, "operation_key")
        ],
        "{summary}"
    );
    assert!(refused[0].2.contains("array"), "{refused:?}");
    assert!(refused[1].2.contains("more than once"), "{refused:?}");
    assert!(refused[2].2.contains("more than once"), "{refused:?}");
    assert!(refused[3].2.contains("object"), "{refused:?}");
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(provider_reference AS CHAR) FROM settlement_lines ORDER BY provider_reference",
    )
    .fetch_all(&s.pool)
    .await
    .unwrap();
    assert_eq!(stored, ["re_ok", "re_tags"]);
    s.stop().await;
}

/// A list of exceptions cut at its limit says so, in text and in JSON:
/// how many it shows of how many match, and how to see more. `--limit 0`
/// asks for as many as one list shows (500), and says when that cut it
/// too; above 500 is refused before anything is sent.
#[tokio::test]
async fn a_list_cut_at_its_limit_says_how_many_match() {
    let s = Secure::start(false).await;
    configure(&s).await;
    let dir = scratch("cut-list");
    // 503 refunds nobody enqueued: an UNKNOWN_REFERENCE each.
    let file = path(&dir, "many.csv", &report(503, 0));
    let args = ["import", "--provider", P, "--period", "2025-12-01"];
    settlement(&s, &[&args[..], &[file.as_str()]].concat())
        .await
        .unwrap();
    let text = settlement(&s, &["exceptions"]).await.unwrap();
    let rows = text
        .lines()
        .filter(|l| l.contains("UNKNOWN_REFERENCE"))
        .count();
    assert_eq!(rows, 100, "the default limit");
    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with("showing 100 of 503; --limit 500 (or 0) shows up to 500"),
        "{last}"
    );
    let json = settlement(&s, &["exceptions", "--limit", "0", "--json"])
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["exceptions"].as_array().unwrap().len(), 500);
    assert_eq!((&json["shown"], &json["total"]), (&500.into(), &503.into()));
    let cut = json["cut"].as_str().unwrap();
    assert!(
        cut.starts_with("showing 500 of 503; 500 is the most one list shows"),
        "{cut}"
    );
    let narrow = settlement(&s, &["exceptions", "--limit", "3", "--state", "resolved"])
        .await
        .unwrap();
    assert_eq!(
        narrow.trim(),
        "no settlement exceptions",
        "nothing cut, nothing said"
    );
    let refused = settlement(&s, &["exceptions", "--limit", "501"])
        .await
        .unwrap_err();
    assert!(refused.contains("0..=500"), "{refused}");
    s.stop().await;
}
