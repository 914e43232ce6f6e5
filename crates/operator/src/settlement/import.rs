//! `jobfence settlement import`: a report file streamed to the coordinator
//! in batches as it is read (the file is never held whole), a progress
//! line while it goes, and the summary the coordinator answers. With
//! `--strict` the whole file is checked first (nothing written) and
//! imported only if no line is refused.

use super::read::{read, Format, Read1};
use crate::connection::{channel, Connection};
use crate::pace::Pace;
use crate::refusal::refused_with_flags;
use crate::render::print_json;
use anyhow::Context;
use chrono::{NaiveDate, NaiveDateTime};
use clap::Args;
use jobfence_api::v1 as proto;
use jobfence_api::v1::import_settlement_request::Part;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Lines per streamed message: the most the coordinator takes in one
/// (`MAX_BATCH_LINES`), each message one short transaction there. Fewer
/// and larger transactions cost the database less per line (a batch of
/// 2000 about 30 % less than four of 500; docs/benchmarks.md).
const BATCH: usize = 2000;
/// Bytes of field text after which a batch is sent before it has
/// [`BATCH`] lines: a message stays well under the coordinator's request
/// limit (`serve --max-request-size`, 4 MiB by default).
const BATCH_BYTES: usize = 1 << 20;
/// A line whose fields hold more text than this is refused here, with its
/// number: no report line of a refund needs 256 KiB.
const LINE_BYTES: usize = 256 << 10;

/// `jobfence settlement import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The provider whose report it is (its settings say how to read it).
    #[arg(long)]
    pub provider: String,
    /// The day the report covers (UTC), e.g. 2026-12-01; or --from/--to.
    #[arg(long, conflicts_with_all = ["from", "to"], value_parser = parse_day)]
    pub period: Option<NaiveDate>,
    /// The start of the period covered (RFC 3339 or a date, UTC).
    #[arg(long, requires = "to", value_parser = parse_time)]
    pub from: Option<NaiveDateTime>,
    /// The end of the period covered, exclusive.
    #[arg(long, requires = "from", value_parser = parse_time)]
    pub to: Option<NaiveDateTime>,
    /// csv or jsonl; by default from the file's name (.csv, .jsonl, .json,
    /// .ndjson, each possibly .gz).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Check every line first and import nothing if one is refused.
    #[arg(long)]
    pub strict: bool,
    /// Take a report with no line (the provider refunded nothing in the
    /// period) whose header row names every column of the provider's
    /// settings. Without it such a report is refused and covers nothing: a
    /// failed download leaves an empty file, and a covered period with no
    /// refund would make every succeeded job of it missing at the provider.
    /// A report with no header row (an empty file; JSON lines) or whose
    /// every line is refused is refused all the same.
    #[arg(long)]
    pub allow_empty: bool,
    /// Your name, recorded with the covered period (a coordinator that
    /// authenticates records your credential's name).
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
    /// At most this many lines a second (0: no limit). The coordinator
    /// paces the import itself, resting while the workers' jobs run more
    /// than 15 % slower beside it, and going flat out when nothing else
    /// runs (docs/settlement.md, "Import every report"); this only caps it.
    #[arg(long, default_value_t = 0)]
    pub max_rate: u32,
    /// The report (gzip'd or not); `-` for standard input (with --format).
    pub file: PathBuf,
}

/// A day on the command line.
fn parse_day(s: &str) -> Result<NaiveDate, String> {
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map_err(|_| format!("{s:?} is not a date (YYYY-MM-DD, a day of the calendar)"))
}

/// A time on the command line: RFC 3339, or a date (its midnight UTC).
fn parse_time(s: &str) -> Result<NaiveDateTime, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.naive_utc());
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map(|d| d.and_hms_opt(0, 0, 0).expect("midnight exists"))
        .map_err(|_| format!("{s:?} is neither an RFC 3339 time nor a date (YYYY-MM-DD)"))
}

fn timestamp(t: NaiveDateTime) -> prost_types::Timestamp {
    let utc = t.and_utc();
    prost_types::Timestamp {
        seconds: utc.timestamp(),
        nanos: utc.timestamp_subsec_nanos() as i32,
    }
}

/// The flags of the import's fields, for refusals.
const IMPORT_FLAGS: &crate::refusal::FlagNames = &[
    ("provider", "--provider"),
    ("period_start", "--from"),
    ("period_end", "--to"),
    ("operator", "--operator"),
];

/// The same, for a period given as one day (`--period`).
const DAY_FLAGS: &crate::refusal::FlagNames = &[
    ("provider", "--provider"),
    ("period_start", "--period"),
    ("period_end", "--period"),
    ("operator", "--operator"),
];

/// Runs the import, printing the summary to `out`.
pub(crate) async fn run(
    conn: &Connection,
    args: ImportArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let (from, to) = match (args.period, args.from, args.to) {
        (Some(day), _, _) => {
            let start = day.and_hms_opt(0, 0, 0).expect("midnight exists");
            (start, start + chrono::Duration::days(1))
        }
        (None, Some(f), Some(t)) if t > f => (f, t),
        (None, Some(_), Some(_)) => {
            anyhow::bail!("--to must be after --from: the period is [--from, --to)")
        }
        _ => anyhow::bail!("say which period the report covers: --period DAY, or --from and --to"),
    };
    let flags = if args.period.is_some() {
        DAY_FLAGS
    } else {
        IMPORT_FLAGS
    };
    // A file that is not there is said first, whatever its name.
    if args.file.as_os_str() != "-" {
        std::fs::File::open(&args.file)
            .with_context(|| format!("cannot open the report {}", args.file.display()))?;
    }
    let format = match args.format.or_else(|| Format::of(&args.file)) {
        Some(f) => f,
        None => anyhow::bail!(
            "cannot tell the format of {} from its name: give --format csv or --format jsonl",
            args.file.display()
        ),
    };
    let header = header(&args, from, to);
    if args.strict && args.file.as_os_str() == "-" {
        anyhow::bail!(
            "--strict reads the report twice (checked whole, then imported), and standard \
             input can be read once: save it to a file and import that"
        );
    }
    if args.strict {
        let checked = stream(
            conn,
            &args.file,
            format,
            proto::ImportSettlementHeader {
                check_only: true,
                ..header.clone()
            },
            // Checking writes nothing: it is not paced.
            Pace(0),
            flags,
        )
        .await?;
        if checked.0.lines_refused > 0 || !checked.1.is_empty() {
            summary(out, &args, &checked, true, conn.json)?;
            anyhow::bail!(
                "--strict: {} line(s) refused; nothing was imported",
                checked.0.lines_refused + checked.1.len() as u64
            );
        }
    }
    let done = stream(conn, &args.file, format, header, Pace(args.max_rate), flags).await?;
    summary(out, &args, &done, false, conn.json)?;
    // Exit 1, as `jobs enqueue --from` does: a cron job must notice lines
    // its report lost, though the rest was imported.
    let refused = done.0.lines_refused + done.1.len() as u64;
    anyhow::ensure!(
        refused == 0,
        "{refused} line(s) refused (listed above); the others were imported, and importing the \
         file again once it is mended changes nothing of what was taken"
    );
    Ok(())
}

/// The import's header: what the flags say, and a name to find it by
/// while it runs.
fn header(
    args: &ImportArgs,
    from: NaiveDateTime,
    to: NaiveDateTime,
) -> proto::ImportSettlementHeader {
    proto::ImportSettlementHeader {
        provider: args.provider.clone(),
        period_start: Some(timestamp(from)),
        period_end: Some(timestamp(to)),
        operator: args.operator.clone(),
        check_only: false,
        allow_empty: args.allow_empty,
        import_id: super::progress::import_id(),
    }
}

/// Streams the file; the coordinator's answer and the lines refused here.
/// A file that cannot be read to its end (a cut gzip, bytes that are not
/// UTF-8) cancels the call instead of ending it, so the coordinator
/// records no period and the import can be run again whole.
async fn stream(
    conn: &Connection,
    path: &std::path::Path,
    format: Format,
    header: proto::ImportSettlementHeader,
    pace: Pace,
    flags: &crate::refusal::FlagNames,
) -> anyhow::Result<(proto::ImportSettlementResponse, Vec<proto::RefusedLine>)> {
    let mut client = JobAdminClient::new(channel(conn).await?);
    let (tx, rx) = mpsc::channel::<proto::ImportSettlementRequest>(4);
    let path_owned = path.to_path_buf();
    let sent = Arc::new(AtomicU64::new(0));
    // Ended on every way out of this function.
    let mut line = super::progress::Line::start(client.clone(), &header, sent.clone());
    tx.send(proto::ImportSettlementRequest {
        part: Some(Part::Header(header)),
    })
    .await
    .ok();
    // Held until the whole file was read: the reader's own sender closing
    // must not end the call when the reading failed. Declared before the
    // call, so that on an early return the call is dropped (cancelled)
    // before the stream could end.
    let keep_open = tx.clone();
    // File reading and parsing on a thread of its own; the channel's bound
    // keeps at most a few batches in memory.
    let mut reader =
        tokio::task::spawn_blocking(move || read_and_send(&path_owned, format, pace, tx, &sent));
    let call = client.import_settlement(tokio_stream::wrappers::ReceiverStream::new(rx));
    tokio::pin!(call);
    let (answer, local) = tokio::select! {
        // The coordinator answered before the file was read (a refusal):
        // the reader stops at its next batch.
        answer = &mut call => {
            drop(keep_open);
            let local = reader.await.context("the file reader stopped")?;
            (answer, local.unwrap_or_default())
        }
        local = &mut reader => {
            let local = local.context("the file reader stopped")?;
            // On a read error, the coordinator is told before the stream
            // closes: a stream that merely ends is a report that ended
            // (the request body outlives this call's future, so dropping
            // the call does not cancel it in time).
            let local = match local {
                Ok(local) => local,
                Err(e) => {
                    let abort = proto::ImportSettlementRequest {
                        part: Some(Part::Abort(proto::SettlementImportAbort {
                            reason: format!("{e:#}"),
                        })),
                    };
                    let _ = keep_open.send(abort).await;
                    drop(keep_open);
                    let _ = call.await;
                    line.end().await;
                    if e.is::<super::read::NotAReport>() {
                        return Err(e.context("nothing was imported, and no period is recorded"));
                    }
                    return Err(e.context("the report could not be read to its end: the import was cancelled (the lines sent so far are kept, no period is recorded); import the whole file again once it reads"));
                }
            };
            drop(keep_open);
            (call.await, local)
        }
    };
    line.end().await;
    match answer {
        Ok(answer) => Ok((answer.into_inner(), local)),
        Err(status) => {
            // The coordinator never saw the lines refused here: a refusal
            // of the whole report ("no line") would otherwise hide why.
            print_refused_here(&local);
            Err(refused_with_flags(status, flags))
        }
    }
}

/// The first lines this command refused itself, on standard error.
fn print_refused_here(local: &[proto::RefusedLine]) {
    for r in local.iter().take(10) {
        eprintln!("refused here: line {}: {}: {}", r.line, r.field, r.reason);
    }
    if local.len() > 10 {
        eprintln!("refused here: {} more lines", local.len() - 10);
    }
}

/// Reads the file, sending batches; returns the lines refused here.
/// `counted`: the lines sent so far, for the progress line.
fn read_and_send(
    path: &std::path::Path,
    format: Format,
    pace: Pace,
    tx: mpsc::Sender<proto::ImportSettlementRequest>,
    counted: &AtomicU64,
) -> anyhow::Result<Vec<proto::RefusedLine>> {
    let mut batch = Vec::with_capacity(BATCH);
    let mut refused = Vec::new();
    let mut sent = 0u64;
    let started = std::time::Instant::now();
    let send = |batch: &mut Vec<proto::SettlementReportLine>, sent: &mut u64| -> bool {
        *sent += batch.len() as u64;
        counted.store(*sent, Ordering::Relaxed);
        let lines = std::mem::take(batch);
        tx.blocking_send(proto::ImportSettlementRequest {
            part: Some(Part::Lines(proto::SettlementLineBatch { lines })),
        })
        .is_ok()
    };
    let mut bytes = 0usize;
    read(path, format, |line| {
        match line {
            Read1::Line(l) => {
                let size: usize = l.fields.iter().map(|(k, v)| k.len() + v.len()).sum();
                if size > LINE_BYTES {
                    refused.push(proto::RefusedLine {
                        line: l.line,
                        field: "line".into(),
                        reason: format!(
                            "the line holds {size} bytes; a report line may hold at most {LINE_BYTES}"
                        ),
                    });
                } else {
                    bytes += size;
                    batch.push(l);
                }
            }
            Read1::Refused(r) => refused.push(r),
            Read1::Columns(names) => {
                return tx
                    .blocking_send(proto::ImportSettlementRequest {
                        part: Some(Part::Columns(proto::SettlementReportColumns { names })),
                    })
                    .is_ok();
            }
        }
        if batch.len() >= BATCH || bytes >= BATCH_BYTES {
            bytes = 0;
            if !send(&mut batch, &mut sent) {
                return false; // the call ended (refused): stop reading
            }
            if let Some(ahead) = pace.ahead(sent, started) {
                std::thread::sleep(ahead);
            }
        }
        true
    })?;
    if !batch.is_empty() {
        send(&mut batch, &mut sent);
    }
    if sent == 0 {
        // Lines every one of which was refused here are no empty report
        // (which --allow-empty would take).
        if let Some(none_taken) = super::read::all_refused(&refused) {
            return Err(none_taken.into());
        }
    }
    Ok(refused)
}

/// Prints the import's summary.
fn summary(
    out: &mut (dyn Write + Send),
    args: &ImportArgs,
    (answer, local): &(proto::ImportSettlementResponse, Vec<proto::RefusedLine>),
    checked_only: bool,
    as_json: bool,
) -> anyhow::Result<()> {
    let mut refused: Vec<&proto::RefusedLine> = local.iter().chain(&answer.refused).collect();
    refused.sort_by_key(|r| r.line);
    if as_json {
        return summary_json(out, args, answer, local, &refused, checked_only);
    }
    let what = if checked_only { "checked" } else { "imported" };
    writeln!(
        out,
        "settlement report of {} {what} ({})",
        args.provider,
        args.file.display()
    )?;
    writeln!(
        out,
        "  lines          {} read, {} refused; {} new, {} updated, {} unchanged",
        answer.lines_read + local.len() as u64,
        answer.lines_refused + local.len() as u64,
        answer.lines_new,
        answer.lines_updated,
        answer.lines_unchanged
    )?;
    if !checked_only {
        decided(out, answer)?;
        if let Some(p) = &answer.pace {
            writeln!(out, "  pace           {}", pace_line(p))?;
        }
    }
    for r in refused.iter().take(100) {
        writeln!(
            out,
            "  refused        line {}: {}: {}",
            r.line, r.field, r.reason
        )?;
    }
    Ok(())
}

/// The summary as one JSON object (`--json`): the counts of the
/// coordinator's answer plus the lines this command refused itself.
fn summary_json(
    out: &mut (dyn Write + Send),
    args: &ImportArgs,
    answer: &proto::ImportSettlementResponse,
    local: &[proto::RefusedLine],
    refused: &[&proto::RefusedLine],
    checked_only: bool,
) -> anyhow::Result<()> {
    let lines: Vec<_> = refused
        .iter()
        .map(|r| json!({"line": r.line, "field": r.field, "reason": r.reason}))
        .collect();
    print_json(
        out,
        &json!({
            "provider": args.provider,
            "checked_only": checked_only,
            "lines_read": answer.lines_read + local.len() as u64,
            "lines_refused": answer.lines_refused + local.len() as u64,
            "refused": lines,
            "lines_new": answer.lines_new,
            "lines_updated": answer.lines_updated,
            "lines_unchanged": answer.lines_unchanged,
            "matched": answer.matched,
            "resolved_job_ids": answer.resolved_job_ids,
            "observed": answer.observed,
            "undecided": answer.undecided,
            "exceptions_opened": answer.exceptions_opened,
            "exceptions_resolved": answer.exceptions_resolved,
            "missing": answer.missing,
            "pace": answer.pace.as_ref().map(|p| json!({
                "state": p.state().as_str_name(),
                "slower": p.slower,
                "busy": p.busy,
                "yielded_seconds": seconds(p.yielded.as_ref()),
                "probed_seconds": seconds(p.probed.as_ref()),
                "summary": p.summary,
            })),
        }),
    )
}

/// A protobuf duration in seconds (0 when unset).
fn seconds(d: Option<&prost_types::Duration>) -> f64 {
    d.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}

/// How the coordinator paced the import: how long it yielded, and what
/// it found last.
fn pace_line(p: &proto::BackgroundPace) -> String {
    let yielded = seconds(p.yielded.as_ref());
    if yielded <= 0.0 {
        return format!("{}; never yielded", p.summary);
    }
    format!("yielded {yielded:.1} s in all; at the end {}", p.summary)
}

/// The summary's lines of what the imported lines decided.
fn decided(
    out: &mut (dyn Write + Send),
    answer: &proto::ImportSettlementResponse,
) -> anyhow::Result<()> {
    let ids: Vec<String> = answer.resolved_job_ids.iter().map(u64::to_string).collect();
    writeln!(out, "  matched        {}", answer.matched)?;
    writeln!(
        out,
        "  resolved       {} manual review{}{}",
        ids.len(),
        if ids.len() == 1 { "" } else { "s" },
        if ids.is_empty() {
            String::new()
        } else {
            format!(" (jobs {})", ids.join(", "))
        }
    )?;
    writeln!(
        out,
        "  observed       {} (jobs still ready or running)",
        answer.observed
    )?;
    writeln!(
        out,
        "  pending        {} with no settled refund yet",
        counted(answer.undecided, "key", "keys")
    )?;
    writeln!(
        out,
        "  exceptions     {} opened, {} resolved by the report; {} succeeded jobs with no refund",
        answer.exceptions_opened, answer.exceptions_resolved, answer.missing
    )?;
    Ok(())
}

/// `n` with its noun, singular or plural.
fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
