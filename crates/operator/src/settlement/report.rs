//! What `settlement report`, `settlement exceptions` and `settlement
//! configure` print.

use super::{ActArgs, ExceptionsArgs, ExceptionsCommand};
use crate::connection::{channel, Connection};
use crate::refusal::{refused, refused_read_with_flags, FlagNames};

/// The flags of the settlement reads' fields, for refusals.
const READ_FLAGS: &FlagNames = &[
    ("provider", "--provider"),
    ("states[", "--state"),
    ("job_id", "--job"),
    ("limit", "--limit"),
];
use crate::render::{print_json, secs, table, time};
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use serde_json::{json, Value};
use std::io::Write;

/// Kinds that page someone.
const CRITICAL: [&str; 3] = [
    "DOUBLE_REFUND",
    "REFUND_NOT_RECORDED",
    "MISSING_AT_PROVIDER",
];

fn settings_json(s: &proto::SettlementSettings) -> Value {
    let c = s.columns.clone().unwrap_or_default();
    json!({
        "provider": s.provider,
        "preset": s.preset,
        "columns": {
            "provider_reference": c.provider_reference, "operation_key": c.operation_key,
            "amount": c.amount, "amount_unit": c.amount_unit, "currency": c.currency,
            "status": c.status, "created": c.created, "created_format": c.created_format,
        },
        "lag_seconds": secs(&s.lag),
        "queues": s.queues.iter().map(|q| json!({
            "queue": q.queue, "amount_pointer": q.amount_pointer, "currency_pointer": q.currency_pointer,
        })).collect::<Vec<_>>(),
    })
}

/// A provider's settings.
pub(super) fn settings(
    out: &mut (dyn Write + Send),
    s: Option<&proto::SettlementSettings>,
    as_json: bool,
) -> anyhow::Result<()> {
    let Some(s) = s else { return Ok(()) };
    if as_json {
        return print_json(out, &settings_json(s));
    }
    let c = s.columns.clone().unwrap_or_default();
    let preset = if s.preset.is_empty() {
        "none"
    } else {
        &s.preset
    };
    writeln!(
        out,
        "settlement of {} (preset {preset}; lag {} s)",
        s.provider,
        secs(&s.lag).unwrap_or(0)
    )?;
    writeln!(
        out,
        "  columns: provider_reference={} operation_key={} amount={} ({}) currency={} status={} created={} ({})",
        c.provider_reference, c.operation_key, c.amount, c.amount_unit, c.currency, c.status, c.created, c.created_format
    )?;
    for q in &s.queues {
        let pointers = if q.amount_pointer.is_empty() {
            "amounts not compared".to_owned()
        } else {
            format!(
                "amount {} currency {}",
                q.amount_pointer, q.currency_pointer
            )
        };
        writeln!(out, "  queue {}: {pointers}", q.queue)?;
    }
    Ok(())
}

/// How `settlement report` ended when it is not a success, for cron: a
/// critical exception is open (exit status 1), or the report could not be
/// read at all (exit status 2; the coordinator unreachable, a refusal).
#[derive(Debug)]
pub enum ReportVerdict {
    /// This many critical exceptions (DOUBLE_REFUND, REFUND_NOT_RECORDED,
    /// MISSING_AT_PROVIDER) are open.
    CriticalOpen(u64),
    /// Nothing could be said: why.
    CouldNotTell(anyhow::Error),
}

impl std::fmt::Display for ReportVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReportVerdict::CriticalOpen(n) => write!(
                f,
                "{n} critical settlement exception(s) open: see `jobfence settlement exceptions`"
            ),
            ReportVerdict::CouldNotTell(e) => write!(f, "no settlement report: {e:#}"),
        }
    }
}

impl std::error::Error for ReportVerdict {}

impl ReportVerdict {
    /// The process exit status: 1 while a critical exception is open, 2
    /// when the report could not be read.
    pub fn exit_status(&self) -> u8 {
        match self {
            ReportVerdict::CriticalOpen(_) => 1,
            ReportVerdict::CouldNotTell(_) => 2,
        }
    }
}

/// `settlement report`: fails with [`ReportVerdict::CriticalOpen`] while a
/// critical exception is open, and with [`ReportVerdict::CouldNotTell`]
/// when it cannot read the report.
pub(super) async fn run(
    conn: &Connection,
    provider: Option<String>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let all = read_report(conn, provider)
        .await
        .map_err(|e| anyhow::Error::new(ReportVerdict::CouldNotTell(e)))?;
    let critical_open: u64 = all
        .providers
        .iter()
        .flat_map(|p| &p.exceptions)
        .filter(|e| e.state == "open" && CRITICAL.contains(&e.kind.as_str()))
        .map(|e| e.count)
        .sum();
    if conn.json {
        let providers: Vec<Value> = all.providers.iter().map(provider_json).collect();
        print_json(
            out,
            &json!({"providers": providers, "critical_open": critical_open}),
        )?;
    } else {
        for p in &all.providers {
            provider_text(out, p)?;
        }
        if all.providers.is_empty() {
            writeln!(
                out,
                "no provider has settlement settings (jobfence settlement configure)"
            )?;
        }
    }
    if critical_open > 0 {
        return Err(ReportVerdict::CriticalOpen(critical_open).into());
    }
    Ok(())
}

async fn read_report(
    conn: &Connection,
    provider: Option<String>,
) -> anyhow::Result<proto::GetSettlementResponse> {
    let mut client = JobAdminClient::new(channel(conn).await?);
    Ok(client
        .get_settlement(proto::GetSettlementRequest {
            provider: provider.unwrap_or_default(),
        })
        .await
        .map_err(|s| refused_read_with_flags(s, READ_FLAGS))?
        .into_inner())
}

fn provider_json(p: &proto::ProviderSettlement) -> Value {
    json!({
        "settings": p.settings.as_ref().map(settings_json),
        "periods": p.periods.iter().map(|x| json!({
            "start": time(&x.start), "end": time(&x.end),
            "last_imported_at": time(&x.last_imported_at), "last_imported_by": x.last_imported_by,
        })).collect::<Vec<_>>(),
        "lines": p.lines.iter().map(|l| (l.status.clone(), json!(l.count))).collect::<serde_json::Map<_, _>>(),
        "matched": p.matched,
        "resolved_reviews": p.resolved_reviews,
        "exceptions": p.exceptions.iter().map(|e| json!({
            "kind": e.kind, "severity": e.severity, "state": e.state, "count": e.count,
        })).collect::<Vec<_>>(),
        "amounts_not_compared": p.amounts_not_compared,
    })
}

fn provider_text(
    out: &mut (dyn Write + Send),
    p: &proto::ProviderSettlement,
) -> anyhow::Result<()> {
    let name = p.settings.as_ref().map_or("?", |s| s.provider.as_str());
    writeln!(out, "provider {name}")?;
    for period in &p.periods {
        writeln!(
            out,
            "  covered        {} → {} (imported {} by {})",
            time(&period.start),
            time(&period.end),
            time(&period.last_imported_at),
            period.last_imported_by
        )?;
    }
    if p.periods.is_empty() {
        writeln!(out, "  covered        nothing imported yet")?;
    }
    let lines: Vec<String> = p
        .lines
        .iter()
        .map(|l| format!("{} {}", l.status, l.count))
        .collect();
    writeln!(
        out,
        "  lines          {}",
        if lines.is_empty() {
            "none".into()
        } else {
            lines.join(", ")
        }
    )?;
    writeln!(
        out,
        "  matched        {} refunds to their succeeded jobs",
        p.matched
    )?;
    writeln!(
        out,
        "  resolved       {} manual review{} by the report",
        p.resolved_reviews,
        if p.resolved_reviews == 1 { "" } else { "s" }
    )?;
    let rows: Vec<Vec<String>> = p
        .exceptions
        .iter()
        .map(|e| {
            vec![
                e.kind.clone(),
                e.severity.clone(),
                e.state.clone(),
                e.count.to_string(),
            ]
        })
        .collect();
    if rows.is_empty() {
        writeln!(out, "  exceptions     none")?;
    } else {
        table(out, &["KIND", "SEVERITY", "STATE", "COUNT"], &rows)?;
    }
    if !p.amounts_not_compared.is_empty() {
        writeln!(
            out,
            "  amounts        not compared for {} (no pointers: jobfence settlement configure --amounts)",
            p.amounts_not_compared.join(", ")
        )?;
    }
    Ok(())
}

fn exception_json(e: &proto::SettlementException) -> Value {
    json!({
        "id": e.id, "provider": e.provider, "kind": e.kind, "severity": e.severity,
        "subject": e.subject, "job_id": (e.job_id != 0).then_some(e.job_id), "detail": e.detail,
        "state": e.state, "opened_at": time(&e.opened_at), "updated_at": time(&e.updated_at),
        "actions": e.actions.iter().map(|a| json!({
            "action": a.action, "operator": a.operator, "note": a.note, "at": time(&a.acted_at),
        })).collect::<Vec<_>>(),
    })
}

/// The most exceptions one list shows (`ListSettlementExceptions`'s
/// limit): what `--limit 0` asks for.
const MOST_LISTED: u32 = 500;

/// `settlement exceptions` with no subcommand: the list, and, when the
/// limit cut it, how many it shows of how many match.
async fn list(
    client: &mut JobAdminClient<crate::connection::Authed>,
    a: ExceptionsArgs,
    out: &mut (dyn Write + Send),
    json: bool,
) -> anyhow::Result<()> {
    let limit = if a.limit == 0 { MOST_LISTED } else { a.limit };
    let list = client
        .list_settlement_exceptions(proto::ListSettlementExceptionsRequest {
            provider: a.provider.unwrap_or_default(),
            states: a.state,
            job_id: a.job.unwrap_or(0),
            id: 0,
            limit,
        })
        .await
        .map_err(|s| refused_read_with_flags(s, READ_FLAGS))?
        .into_inner();
    let shown = list.exceptions.len() as u64;
    // A coordinator older than `total` answers 0: then only a full list
    // says that more may match.
    let total = (list.total >= shown).then_some(list.total);
    let cut = match total {
        Some(total) => total > shown,
        None => shown == u64::from(limit),
    };
    let note = cut.then(|| cut_note(shown, total, limit));
    if json {
        return print_json(
            out,
            &json!({
                "exceptions": list.exceptions.iter().map(exception_json).collect::<Vec<_>>(),
                "shown": shown,
                "total": total,
                "cut": note,
            }),
        );
    }
    list_text(out, &list.exceptions)?;
    if let Some(note) = note {
        writeln!(out, "{note}")?;
    }
    Ok(())
}

/// What a list cut at `limit` says: how many it shows of how many match
/// (`None`: not told), and how to see more.
fn cut_note(shown: u64, total: Option<u64>, limit: u32) -> String {
    let of = total.map_or_else(
        || format!("showing {shown}; more may match"),
        |t| format!("showing {shown} of {t}"),
    );
    let more = if limit < MOST_LISTED {
        format!("--limit {MOST_LISTED} (or 0) shows up to {MOST_LISTED}, or narrow")
    } else {
        format!("{MOST_LISTED} is the most one list shows: narrow")
    };
    format!("{of}; {more} with --provider, --state or --job")
}

/// `settlement exceptions ack|resolve ID`: moves the exception from the
/// state it is in now to `to`; the coordinator refuses if someone moves it
/// meanwhile. The exception afterwards, as a one-item list.
async fn act(
    client: &mut JobAdminClient<crate::connection::Authed>,
    args: &ActArgs,
    to: &str,
) -> Result<tonic::Response<proto::ListSettlementExceptionsResponse>, tonic::Status> {
    let now = client
        .list_settlement_exceptions(proto::ListSettlementExceptionsRequest {
            id: args.id,
            ..Default::default()
        })
        .await?
        .into_inner();
    let seen = now
        .exceptions
        .first()
        .map(|e| e.state.clone())
        .unwrap_or_default();
    let done = client
        .act_on_settlement_exception(proto::ActOnSettlementExceptionRequest {
            id: args.id,
            seen_state: seen,
            to_state: to.into(),
            operator: args.operator.clone(),
            note: args.note.clone(),
        })
        .await?
        .into_inner();
    Ok(tonic::Response::new(
        proto::ListSettlementExceptionsResponse {
            exceptions: done.exception.into_iter().collect(),
            total: 1,
        },
    ))
}

/// `settlement exceptions [show|ack|resolve]`.
pub(super) async fn exceptions(
    conn: &Connection,
    a: ExceptionsArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let mut client = JobAdminClient::new(channel(conn).await?);
    let one = |id: u64| proto::ListSettlementExceptionsRequest {
        id,
        ..Default::default()
    };
    let shown = match a.command {
        None => return list(&mut client, a, out, conn.json).await,
        Some(ExceptionsCommand::Show { id }) => client.list_settlement_exceptions(one(id)).await,
        Some(ExceptionsCommand::Ack(x)) => act(&mut client, &x, "acknowledged").await,
        Some(ExceptionsCommand::Resolve(x)) => act(&mut client, &x, "resolved").await,
    };
    let shown = shown.map_err(refused)?.into_inner();
    for e in &shown.exceptions {
        if conn.json {
            print_json(out, &exception_json(e))?;
            continue;
        }
        writeln!(
            out,
            "exception {} of {}: {} ({}), {}",
            e.id, e.provider, e.kind, e.severity, e.state
        )?;
        writeln!(
            out,
            "  subject  {}{}",
            e.subject,
            if e.job_id != 0 {
                format!(" (job {})", e.job_id)
            } else {
                String::new()
            }
        )?;
        writeln!(out, "  detail   {}", e.detail)?;
        for step in &e.actions {
            writeln!(
                out,
                "  {}  {} by {}: {}",
                time(&step.acted_at),
                step.action,
                step.operator,
                step.note
            )?;
        }
    }
    Ok(())
}

fn list_text(
    out: &mut (dyn Write + Send),
    list: &[proto::SettlementException],
) -> anyhow::Result<()> {
    if list.is_empty() {
        writeln!(out, "no settlement exceptions")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                e.provider.clone(),
                e.kind.clone(),
                e.severity.clone(),
                e.state.clone(),
                e.subject.clone(),
                if e.job_id == 0 {
                    "-".into()
                } else {
                    e.job_id.to_string()
                },
                e.detail.clone(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "ID", "PROVIDER", "KIND", "SEVERITY", "STATE", "SUBJECT", "JOB", "DETAIL",
        ],
        &rows,
    )?;
    Ok(())
}
