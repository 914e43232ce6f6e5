//! `jobfence events list|watch`: the events feed (the outbox) read by
//! cursor, one page or followed as it grows; and the events table that
//! `jobs show` prints too.

use crate::connection::{channel, Connection};
use crate::refusal::refused;
use crate::render::{print_json, state_name, table, time};
use clap::{Args, Subcommand};
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_events_client::JobEventsClient;
use serde_json::{json, Value};
use std::io::Write;

/// `jobfence events …`
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: EventsCommand,
}

/// The `events` subcommands.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// One page of events after a cursor.
    List {
        /// Events after this event id.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// At most this many events (1..=1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Replay from a cursor, then follow new events (Ctrl-C to stop).
    Watch {
        /// Events after this event id.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
}

/// Runs `events …`, printing to `out` (`watch` until the stream ends).
pub(crate) async fn run(args: EventsArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let json = args.conn.json;
    let mut client = JobEventsClient::new(channel(&args.conn).await?);
    match args.command {
        EventsCommand::List {
            after,
            limit,
            queue,
        } => {
            let page = client
                .list_events(proto::ListEventsRequest {
                    after_event_id: after,
                    limit,
                    queue: queue.unwrap_or_default(),
                })
                .await
                .map_err(refused)?
                .into_inner();
            event_page(out, &page, json)
        }
        EventsCommand::Watch { after, queue } => {
            let mut stream = client
                .watch_events(proto::WatchEventsRequest {
                    after_event_id: after,
                    queue: queue.unwrap_or_default(),
                })
                .await
                .map_err(refused)?
                .into_inner();
            while let Some(msg) = stream.message().await.map_err(refused)? {
                if let Some(e) = msg.event {
                    event_line(out, &e, json)?;
                    out.flush()?;
                }
            }
            Ok(())
        }
    }
}

/// One event as JSON, as `events` and `jobs show --json` print it.
pub(crate) fn event_json(e: &proto::JobEvent) -> Value {
    json!({
        "event_id": e.event_id,
        "job_id": e.job_id,
        "queue": e.queue,
        "operation_key": e.operation_key,
        "attempt": e.attempt,
        "kind": e.kind,
        "from_state": state_name(e.from_state),
        "to_state": state_name(e.to_state),
        "current_attempt": e.current_attempt,
        "detail": e.detail,
        "created_at": time(&e.created_at),
    })
}

/// Events as a table, as `events list` and `jobs show` print them.
pub(crate) fn event_table(out: &mut dyn Write, events: &[proto::JobEvent]) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                e.event_id.to_string(),
                e.job_id.to_string(),
                e.kind.clone(),
                e.attempt.to_string(),
                e.current_attempt.to_string(),
                state_name(e.from_state),
                state_name(e.to_state),
                time(&e.created_at),
                e.detail.clone(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "EVENT", "JOB", "KIND", "ATTEMPT", "CURRENT", "FROM", "TO", "AT (UTC)", "DETAIL",
        ],
        &rows,
    )?;
    Ok(())
}

/// `events list`.
fn event_page(
    out: &mut dyn Write,
    page: &proto::ListEventsResponse,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({
                "events": page.events.iter().map(event_json).collect::<Vec<_>>(),
                "next_after_event_id": page.next_after_event_id,
            }),
        );
    }
    event_table(out, &page.events)?;
    writeln!(out, "next: --after {}", page.next_after_event_id)?;
    Ok(())
}

/// One line of `events watch` (JSON Lines with `--json`).
fn event_line(out: &mut dyn Write, e: &proto::JobEvent, json: bool) -> anyhow::Result<()> {
    if json {
        writeln!(out, "{}", event_json(e))?;
    } else {
        writeln!(
            out,
            "{} job={} queue={} kind={} attempt={} {}->{} {}",
            e.event_id,
            e.job_id,
            e.queue,
            e.kind,
            e.attempt,
            state_name(e.from_state),
            state_name(e.to_state),
            e.detail
        )?;
    }
    Ok(())
}
