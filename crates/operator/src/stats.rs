//! `jobfence stats`: per queue, the jobs in each state, the oldest due,
//! running and parked job's age, and the takeovers and stale-write
//! rejections over a window.

use crate::connection::{channel, Connection};
use crate::duration;
use crate::refusal::refused;
use crate::render::{age, print_json, secs, state_name, table, time};
use clap::Args;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{self as proto, JobState};
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

/// `jobfence stats`
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Window of the takeover and rejection counts.
    #[arg(long, value_parser = crate::args::duration_arg, default_value = "1h")]
    pub window: Duration,
}

/// Runs `stats`, printing to `out`.
pub(crate) async fn run(args: StatsArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let mut client = JobAdminClient::new(channel(&args.conn).await?);
    let stats = client
        .queue_stats(proto::QueueStatsRequest {
            queue: args.queue.unwrap_or_default(),
            window: Some(duration(args.window)),
        })
        .await
        .map_err(refused)?
        .into_inner();
    if args.conn.json {
        return print_json(out, &stats_json(&stats));
    }
    stats_table(out, &stats)
}

/// The oldest job of `q` in `state`, if any is.
fn oldest(q: &proto::QueueStats, state: JobState) -> Option<proto::PendingAge> {
    q.oldest.iter().find(|o| o.state == state as i32).cloned()
}

/// `stats --json`: the counts and the oldest ages keyed by state name.
fn stats_json(s: &proto::QueueStatsResponse) -> Value {
    let queues: Vec<Value> = s
        .queues
        .iter()
        .map(|q| {
            let counts: serde_json::Map<String, Value> = q
                .counts
                .iter()
                .map(|c| (state_name(c.state), json!(c.jobs)))
                .collect();
            let ages: serde_json::Map<String, Value> = q
                .oldest
                .iter()
                .map(|o| {
                    (
                        state_name(o.state),
                        json!({"age_seconds": secs(&o.age), "job_id": o.job_id}),
                    )
                })
                .collect();
            json!({
                "queue": q.queue,
                "counts": counts,
                "oldest_pending": ages,
                "oldest_unfinished_age_seconds": secs(&q.oldest_unfinished_age),
                "takeovers": q.takeovers,
                "stale_write_rejections": q.stale_write_rejections,
                "held": q.held.as_ref().map(|h| json!({
                    "provider": h.provider,
                    "kind": h.kind,
                    "why": h.why,
                    "since": time(&h.since),
                    "by": h.by,
                })),
                "due_keys": q.due_keys.iter().map(backlog_json).collect::<Vec<_>>(),
                "other_keys": q.other_keys.as_ref().map(backlog_json),
            })
        })
        .collect();
    json!({"window_seconds": secs(&s.window), "queues": queues})
}

fn backlog_json(k: &proto::KeyBacklog) -> Value {
    json!({
        "fairness_key": k.fairness_key,
        "keys": k.keys,
        "due": k.due,
        "oldest_due_age_seconds": secs(&k.oldest_due_age),
    })
}

/// The due jobs of a queue by fairness key (docs/design.md rule 18),
/// when it has more than one key: the keys with the most, then the rest.
fn due_keys(out: &mut dyn Write, q: &proto::QueueStats) -> anyhow::Result<()> {
    if q.due_keys.len() < 2 && q.other_keys.is_none() {
        return Ok(());
    }
    let name = |k: &proto::KeyBacklog| match k.fairness_key.as_str() {
        "" => "(no key)".to_owned(),
        key => key.escape_debug().to_string(),
    };
    let mut line: Vec<String> = q
        .due_keys
        .iter()
        .map(|k| format!("{} {} (oldest {})", name(k), k.due, age(&k.oldest_due_age)))
        .collect();
    if let Some(o) = &q.other_keys {
        line.push(format!(
            "{} other keys {} (oldest {})",
            o.keys,
            o.due,
            age(&o.oldest_due_age)
        ));
    }
    writeln!(out, "{}: due by fairness key: {}", q.queue, line.join(", "))?;
    Ok(())
}

/// `stats`: one row per queue, then the window the counts cover.
fn stats_table(out: &mut dyn Write, s: &proto::QueueStatsResponse) -> anyhow::Result<()> {
    let count = |q: &proto::QueueStats, state: JobState| {
        q.counts
            .iter()
            .find(|c| c.state == state as i32)
            .map_or(0, |c| c.jobs)
            .to_string()
    };
    let rows: Vec<Vec<String>> = s
        .queues
        .iter()
        .map(|q| {
            vec![
                q.queue.clone(),
                count(q, JobState::Ready),
                count(q, JobState::Running),
                count(q, JobState::ManualReview),
                count(q, JobState::Succeeded),
                count(q, JobState::Failed),
                count(q, JobState::Cancelled),
                age(&oldest(q, JobState::Ready).and_then(|o| o.age)),
                age(&oldest(q, JobState::Running).and_then(|o| o.age)),
                age(&oldest(q, JobState::ManualReview).and_then(|o| o.age)),
                age(&q.oldest_unfinished_age),
                q.takeovers.to_string(),
                q.stale_write_rejections.to_string(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "QUEUE",
            "READY",
            "RUNNING",
            "REVIEW",
            "SUCCEEDED",
            "FAILED",
            "CANCELLED",
            "OLDEST_DUE",
            "OLDEST_RUNNING",
            "OLDEST_REVIEW",
            "OLDEST_UNFINISHED",
            "TAKEOVERS",
            "STALE_REJECTED",
        ],
        &rows,
    )?;
    writeln!(
        out,
        "takeovers and stale rejections over the last {}",
        age(&s.window)
    )?;
    for q in &s.queues {
        due_keys(out, q)?;
    }
    for q in &s.queues {
        let Some(h) = &q.held else { continue };
        let by = match (&h.since, h.by.as_str()) {
            (Some(_), by) if !by.is_empty() => format!(" (by {by} since {})", time(&h.since)),
            _ => String::new(),
        };
        writeln!(
            out,
            "{}: {} ready held: {}{by}",
            q.queue,
            count(q, JobState::Ready),
            h.why
        )?;
    }
    Ok(())
}
