//! `jobfence workers`: the workers seen by any coordinator (ListWorkers,
//! docs/operating.md "Workers"): live or stale, client, the coordinator
//! of the latest call, calls per minute, and the jobs each holds.

use crate::connection::{channel, Connection};
use crate::duration;
use crate::refusal::refused;
use crate::render::{age, print_json, secs, table};
use clap::Args;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{self as proto};
use serde_json::json;
use std::io::Write;
use std::time::Duration;

/// `jobfence workers`
#[derive(Debug, Args)]
pub struct WorkersArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// A worker silent this long, holding no lease, is stale.
    #[arg(long, value_parser = crate::args::duration_arg, default_value = "60s")]
    pub stale_after: Duration,
    /// Only workers whose last call is at most this old.
    #[arg(long, value_parser = crate::args::duration_arg, default_value = "15m")]
    pub within: Duration,
}

/// Runs `workers`, printing to `out`.
pub(crate) async fn run(args: WorkersArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let mut client = JobAdminClient::new(channel(&args.conn).await?);
    let listed = client
        .list_workers(proto::ListWorkersRequest {
            stale_after: Some(duration(args.stale_after)),
            within: Some(duration(args.within)),
        })
        .await
        .map_err(refused)?
        .into_inner();
    if args.conn.json {
        let workers: Vec<_> = listed.workers.iter().map(worker_json).collect();
        return print_json(out, &json!({ "workers": workers }));
    }
    if listed.workers.is_empty() {
        writeln!(
            out,
            "no worker called any coordinator in the last {}",
            humantime::format_duration(args.within)
        )?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = listed.workers.iter().map(worker_row).collect();
    table(
        out,
        &[
            "WORKER",
            "STATE",
            "CLIENT",
            "QUEUE",
            "LAST_CALL",
            "CALLS/MIN",
            "COORDINATOR",
            "HOLDS (job@attempt, lease left)",
        ],
        &rows,
    )?;
    let live = listed.workers.iter().filter(|w| w.live).count();
    writeln!(
        out,
        "{live} live, {} stale (stale: no call for {}, no lease running)",
        listed.workers.len() - live,
        humantime::format_duration(args.stale_after)
    )?;
    Ok(())
}

/// `s` with its control characters escaped: a worker chooses its id, and
/// must not write into the operator's terminal.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

fn worker_row(w: &proto::Worker) -> Vec<String> {
    let holds: Vec<String> = w
        .held
        .iter()
        .map(|j| match secs(&j.lease_left) {
            Some(s) if s < 0 => format!("{}@{} (lease ended {}s ago)", j.job_id, j.attempt, -s),
            _ => format!("{}@{} ({})", j.job_id, j.attempt, age(&j.lease_left)),
        })
        .collect();
    vec![
        printable(&w.worker_id),
        if w.live { "live" } else { "stale" }.to_owned(),
        printable(&w.client),
        w.queue.clone(),
        format!("{} ago", age(&w.last_call_ago)),
        w.calls_per_minute.to_string(),
        printable(&w.coordinator),
        holds.join(", "),
    ]
}

fn worker_json(w: &proto::Worker) -> serde_json::Value {
    let held: Vec<_> = w
        .held
        .iter()
        .map(|j| {
            json!({
                "job_id": j.job_id,
                "queue": j.queue,
                "attempt": j.attempt,
                "lease_left_seconds": secs(&j.lease_left),
            })
        })
        .collect();
    json!({
        "worker_id": w.worker_id,
        "live": w.live,
        "client": w.client,
        "queue": w.queue,
        "coordinator": w.coordinator,
        "last_call_seconds_ago": secs(&w.last_call_ago),
        "first_seen_seconds_ago": secs(&w.first_seen_ago),
        "calls_per_minute": w.calls_per_minute,
        "held": held,
    })
}
