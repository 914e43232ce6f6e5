//! `jobfence queue-policies list|set|delete|history`: queues' stored
//! resend policies (resend window, max dispatches, retention), which win
//! over every coordinator's flags (docs/design.md rule 13).

use crate::changes::{history, ChangeArgs, HistoryArgs};
use crate::connection::{channel, Connection};
use crate::duration;
use crate::refusal::{refused, refused_with_flags, FlagNames};
use crate::render::{print_json, secs, span, table, time};
use clap::{Args, Subcommand};
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

/// `jobfence queue-policies …`
#[derive(Debug, Args)]
pub struct QueuePoliciesArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: QueuePoliciesCommand,
}

/// The `queue-policies` subcommands.
#[derive(Debug, Subcommand)]
pub enum QueuePoliciesCommand {
    /// Every queue with a stored policy or a provider. A queue without a
    /// stored policy follows each coordinator's --resend-window and
    /// --max-dispatches flags.
    List,
    /// Store a queue's resend policy; it wins over every coordinator's
    /// --resend-window / --max-dispatches flags.
    Set {
        /// The queue.
        queue: String,
        /// The provider's idempotency window, counted from a job's first
        /// dispatch (e.g. 24h for Stripe).
        #[arg(long, value_parser = crate::args::duration_arg)]
        resend_window: Duration,
        /// The most times a job may be handed out to be sent (execute).
        #[arg(long)]
        max_dispatches: u32,
        /// How long the queue's finished jobs are kept before they are
        /// pruned (e.g. 90d); unset: the coordinators' --retention-jobs.
        /// Their key records are kept at least as long.
        #[arg(long, value_parser = crate::args::duration_arg)]
        retention: Option<Duration>,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Remove a queue's stored resend policy: the flags apply again.
    Delete {
        /// The queue.
        queue: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// The recorded changes of one queue's policy (or of every provider
    /// and queue), newest first.
    History(HistoryArgs),
    /// Hold a queue's claims, with or without a provider, on every
    /// coordinator until `resume` (its ready jobs stay ready; to purge
    /// them, `jobs bulk cancel --queue Q`).
    Pause {
        /// The queue.
        queue: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Let a paused queue's claims hand out again.
    Resume {
        /// The queue.
        queue: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
}

/// The flags of `queue-policies set` and `delete`.
const QUEUE_POLICY_FLAGS: &FlagNames = &[
    ("queue", "QUEUE"),
    ("resend_window", "--resend-window"),
    ("max_dispatches", "--max-dispatches"),
    ("job_retention", "--retention"),
    ("operator", "--operator"),
    ("reason", "--reason"),
];

fn refused_queue_policy(status: tonic::Status) -> anyhow::Error {
    refused_with_flags(status, QUEUE_POLICY_FLAGS)
}

/// `queue-policies pause` and `resume`.
async fn pause_or_resume(
    client: &mut JobAdminClient<crate::connection::Authed>,
    cmd: QueuePoliciesCommand,
    out: &mut (dyn Write + Send),
    json: bool,
) -> anyhow::Result<()> {
    match cmd {
        QueuePoliciesCommand::Pause { queue, change } => {
            client
                .pause_queue(proto::PauseQueueRequest {
                    queue: queue.clone(),
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_queue_policy)?;
            paused(
                out,
                &queue,
                "paused: its claims hand out nothing until it is resumed",
                json,
            )
        }
        QueuePoliciesCommand::Resume { queue, change } => {
            let done = client
                .resume_queue(proto::ResumeQueueRequest {
                    queue: queue.clone(),
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_queue_policy)?
                .into_inner();
            let what = if done.resumed {
                "resumed"
            } else {
                "was not paused: nothing changed"
            };
            paused(out, &queue, what, json)
        }
        _ => unreachable!("only pause and resume come here"),
    }
}

fn paused(out: &mut dyn Write, queue: &str, what: &str, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(out, &serde_json::json!({ "queue": queue, "done": what }));
    }
    writeln!(out, "queue {queue} {what}")?;
    Ok(())
}

/// Runs `queue-policies …`, printing to `out`.
pub(crate) async fn run(
    args: QueuePoliciesArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let json = args.conn.json;
    let mut client = JobAdminClient::new(channel(&args.conn).await?);
    match args.command {
        QueuePoliciesCommand::List => {
            let all = client
                .list_queue_policies(proto::ListQueuePoliciesRequest {})
                .await
                .map_err(refused)?
                .into_inner();
            queue_policies(out, &all.policies, json)
        }
        QueuePoliciesCommand::Set {
            queue,
            resend_window,
            max_dispatches,
            retention,
            change,
        } => {
            let done = client
                .put_queue_policy(proto::PutQueuePolicyRequest {
                    queue,
                    resend_window: Some(duration(resend_window)),
                    max_dispatches: Some(max_dispatches),
                    job_retention: retention.map(duration),
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_queue_policy)?
                .into_inner();
            queue_policy_changed(out, "stored", done.policy.as_ref(), json)
        }
        QueuePoliciesCommand::Delete { queue, change } => {
            let done = client
                .delete_queue_policy(proto::DeleteQueuePolicyRequest {
                    queue,
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_queue_policy)?
                .into_inner();
            queue_policy_changed(out, "deleted", done.policy.as_ref(), json)
        }
        cmd @ (QueuePoliciesCommand::Pause { .. } | QueuePoliciesCommand::Resume { .. }) => {
            pause_or_resume(&mut client, cmd, out, json).await
        }
        QueuePoliciesCommand::History(h) => {
            let subject = h
                .name
                .as_deref()
                .map(jobfence_domain::providers::queue_subject)
                .unwrap_or_default();
            history(&mut client, subject, h, out, json).await
        }
    }
}

fn queue_policy_json(q: &proto::QueuePolicy) -> Value {
    json!({
        "queue": q.queue,
        "provider": q.provider,
        "resend_window_seconds": secs(&q.resend_window),
        "max_dispatches": q.max_dispatches,
        "job_retention_seconds": secs(&q.job_retention),
        "updated_at": time(&q.updated_at),
        "updated_by": q.updated_by,
    })
}

fn queue_policy_rows(all: &[proto::QueuePolicy]) -> Vec<Vec<String>> {
    all.iter()
        .map(|q| {
            let stored = q.resend_window.is_some();
            vec![
                q.queue.clone(),
                q.provider.clone(),
                if stored {
                    span(&q.resend_window)
                } else {
                    "(flags)".to_owned()
                },
                q.max_dispatches
                    .map_or_else(|| "(flags)".to_owned(), |n| n.to_string()),
                if q.job_retention.is_some() {
                    span(&q.job_retention)
                } else {
                    "(flags)".to_owned()
                },
                time(&q.updated_at),
                q.updated_by.clone(),
            ]
        })
        .collect()
}

const QUEUE_POLICY_HEADERS: [&str; 7] = [
    "QUEUE",
    "PROVIDER",
    "RESEND_WINDOW",
    "MAX_DISPATCHES",
    "RETENTION",
    "CHANGED (UTC)",
    "CHANGED_BY",
];

/// `queue-policies list`.
fn queue_policies(
    out: &mut dyn Write,
    all: &[proto::QueuePolicy],
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({ "policies": all.iter().map(queue_policy_json).collect::<Vec<_>>() }),
        );
    }
    table(out, &QUEUE_POLICY_HEADERS, &queue_policy_rows(all))?;
    writeln!(
        out,
        "(flags): no stored resend policy; each coordinator's --resend-window / --max-dispatches apply. Queues not listed: no provider, flags."
    )?;
    Ok(())
}

/// `queue-policies set|delete`.
fn queue_policy_changed(
    out: &mut dyn Write,
    verb: &str,
    policy: Option<&proto::QueuePolicy>,
    json: bool,
) -> anyhow::Result<()> {
    let Some(q) = policy else {
        anyhow::bail!("the server answered without the policy");
    };
    if json {
        return print_json(
            out,
            &json!({ "action": verb, "policy": queue_policy_json(q) }),
        );
    }
    let what = if verb == "deleted" {
        "the coordinators' --resend-window / --max-dispatches flags apply again".to_owned()
    } else {
        format!(
            "resend window {}, at most {} dispatches, on every coordinator",
            span(&q.resend_window),
            q.max_dispatches.unwrap_or_default()
        )
    };
    writeln!(out, "policy of queue {} {verb}: {what}", q.queue)?;
    table(
        out,
        &QUEUE_POLICY_HEADERS,
        &queue_policy_rows(std::slice::from_ref(q)),
    )?;
    Ok(())
}
