//! `jobfence providers list|set|delete|pause|resume|history`: provider
//! budgets (docs/design.md rules 11–13: rate, burst, in-flight cap, costs),
//! the queues they govern, pauses during a provider incident, and the
//! record of every change.

use crate::changes::{history, ChangeArgs, HistoryArgs};
use crate::connection::{channel, Connection};
use crate::refusal::{refused, refused_with_flags, FlagNames};
use crate::render::{enum_name, print_json, span, span_seconds, table, time};
use clap::{Args, Subcommand};
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use serde_json::{json, Value};
use std::io::Write;

/// `jobfence providers …`
#[derive(Debug, Args)]
pub struct ProvidersArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: ProvidersCommand,
}

/// The `providers` subcommands.
#[derive(Debug, Subcommand)]
pub enum ProvidersCommand {
    /// Every provider: its budget, its queues, what is left of the budget
    /// now, jobs in flight, pause and throttle.
    List,
    /// Create a provider or replace its budget and its queues (the change
    /// applies to every claim that starts after it, on every coordinator).
    Set(SetProviderArgs),
    /// Delete a provider: its queues are no longer limited.
    Delete {
        /// The provider.
        name: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Stop hand-outs for a provider (an incident at the provider): all of
    /// them, or with --sends-only only sends, while reconciles go on.
    Pause {
        /// The provider.
        name: String,
        /// Hold sends (first sends and resends) only; reconciles, takeovers
        /// included, go on within the budget.
        #[arg(long, default_value_t = false)]
        sends_only: bool,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// End a pause, and any throttle a worker reported (a 429).
    Resume {
        /// The provider.
        name: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// The recorded changes of providers and queue policies, newest first.
    History(HistoryArgs),
}

/// Arguments of `providers set`.
#[derive(Debug, Args)]
pub struct SetProviderArgs {
    /// The provider (1..=128 bytes of [A-Za-z0-9._-]).
    pub name: String,
    /// Units per second on average (fractions allowed: 0.5 is one every
    /// 2 s). Leave headroom for calls made outside jobfence.
    #[arg(long)]
    pub rate: f64,
    /// Units that may be spent at once after an idle period (at least the
    /// largest cost).
    #[arg(long)]
    pub burst: u32,
    /// Most jobs of its queues running with a live lease at once (no cap
    /// when left out).
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// Units a send (next_action execute) costs (1 when left out).
    #[arg(long)]
    pub execute_cost: Option<u32>,
    /// Units a reconcile costs (1 when left out; 2 when a reconcile takes
    /// two lookups at the provider).
    #[arg(long)]
    pub reconcile_cost: Option<u32>,
    /// The most of the rate one fairness key (a merchant) may spend while
    /// other keys' jobs are due, a fraction in (0, 1]: 0.3 is 30 %
    /// (docs/design.md rule 18; no cap when left out).
    #[arg(long)]
    pub key_share: Option<f64>,
    /// The most jobs of one fairness key in flight (no cap when left out).
    #[arg(long)]
    pub max_in_flight_per_key: Option<u32>,
    /// A queue that dispatches to it (repeat for each). Replaces the
    /// provider's list: name every queue it keeps.
    #[arg(long = "queue", required = true)]
    pub queues: Vec<String>,
    #[command(flatten)]
    pub change: ChangeArgs,
}

/// The flags of `providers set`, `delete`, `pause` and `resume`.
const PROVIDER_FLAGS: &FlagNames = &[
    ("name", "NAME"),
    ("budget.rate_per_second", "--rate"),
    ("budget.burst", "--burst"),
    ("budget.max_in_flight", "--max-in-flight"),
    ("budget.execute_cost", "--execute-cost"),
    ("budget.reconcile_cost", "--reconcile-cost"),
    ("budget.key_share", "--key-share"),
    ("budget.max_in_flight_per_key", "--max-in-flight-per-key"),
    ("queues[", "--queue"),
    ("queues", "--queue"),
    ("operator", "--operator"),
    ("reason", "--reason"),
];

fn refused_provider(status: tonic::Status) -> anyhow::Error {
    refused_with_flags(status, PROVIDER_FLAGS)
}

/// The request of `providers set`: the whole budget and queue list.
fn put_request(s: SetProviderArgs) -> proto::PutProviderRequest {
    proto::PutProviderRequest {
        name: s.name,
        budget: Some(proto::ProviderBudget {
            rate_per_second: s.rate,
            burst: s.burst,
            max_in_flight: s.max_in_flight,
            execute_cost: s.execute_cost,
            reconcile_cost: s.reconcile_cost,
            key_share: s.key_share,
            max_in_flight_per_key: s.max_in_flight_per_key,
        }),
        queues: s.queues,
        operator: s.change.operator,
        reason: s.change.reason,
    }
}

/// The request of `providers pause`: everything, or sends only.
fn pause_request(
    name: String,
    sends_only: bool,
    change: ChangeArgs,
) -> proto::PauseProviderRequest {
    let pause = if sends_only {
        proto::ProviderPause::Sends
    } else {
        proto::ProviderPause::All
    };
    proto::PauseProviderRequest {
        name,
        pause: pause as i32,
        operator: change.operator,
        reason: change.reason,
    }
}

/// Runs `providers …`, printing to `out`.
pub(crate) async fn run(args: ProvidersArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let json = args.conn.json;
    let mut client = JobAdminClient::new(channel(&args.conn).await?);
    match args.command {
        ProvidersCommand::List => {
            let all = client
                .list_providers(proto::ListProvidersRequest {})
                .await
                .map_err(refused)?
                .into_inner();
            providers(out, &all.providers, json)
        }
        ProvidersCommand::Set(s) => {
            let done = client
                .put_provider(put_request(s))
                .await
                .map_err(refused_provider)?
                .into_inner();
            let verb = if done.created { "created" } else { "updated" };
            provider_changed(out, verb, done.provider.as_ref(), json)
        }
        ProvidersCommand::Delete { name, change } => {
            let done = client
                .delete_provider(proto::DeleteProviderRequest {
                    name,
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_provider)?
                .into_inner();
            provider_changed(out, "deleted", done.provider.as_ref(), json)
        }
        ProvidersCommand::Pause {
            name,
            sends_only,
            change,
        } => {
            let done = client
                .pause_provider(pause_request(name, sends_only, change))
                .await
                .map_err(refused_provider)?
                .into_inner();
            provider_changed(out, "paused", done.provider.as_ref(), json)
        }
        ProvidersCommand::Resume { name, change } => {
            let done = client
                .resume_provider(proto::ResumeProviderRequest {
                    name,
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_provider)?
                .into_inner();
            provider_changed(out, "resumed", done.provider.as_ref(), json)
        }
        ProvidersCommand::History(h) => {
            let subject = h
                .name
                .as_deref()
                .map(jobfence_domain::providers::provider_subject)
                .unwrap_or_default();
            history(&mut client, subject, h, out, json).await
        }
    }
}

fn pause_name(raw: i32) -> String {
    proto::ProviderPause::try_from(raw)
        .map(|p| enum_name(p.as_str_name(), "PROVIDER_PAUSE_"))
        .unwrap_or_default()
}

fn provider_json(p: &proto::Provider) -> Value {
    let b = p.budget.unwrap_or_default();
    json!({
        "name": p.name,
        "rate_per_second": b.rate_per_second,
        "burst": b.burst,
        "max_in_flight": b.max_in_flight,
        "execute_cost": b.execute_cost.unwrap_or(1),
        "reconcile_cost": b.reconcile_cost.unwrap_or(1),
        "key_share": b.key_share,
        "max_in_flight_per_key": b.max_in_flight_per_key,
        "queues": p.queues,
        "pause": pause_name(p.pause),
        "pause_reason": p.pause_reason,
        "throttled_until": time(&p.throttled_until),
        "units_available": p.units_available,
        "next_unit_in_seconds": span_seconds(&p.next_unit_in),
        "in_flight": p.in_flight,
        "throttle_reports": p.throttle_reports,
        "updated_at": time(&p.updated_at),
        "updated_by": p.updated_by,
    })
}

fn provider_table(out: &mut dyn Write, all: &[proto::Provider]) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|p| {
            let b = p.budget.unwrap_or_default();
            let pause = match pause_name(p.pause).as_str() {
                "none" => String::new(),
                "sends" => "SENDS".to_owned(),
                other => other.to_uppercase(),
            };
            let in_flight = match b.max_in_flight {
                Some(max) => format!("{}/{max}", p.in_flight),
                None => p.in_flight.to_string(),
            };
            vec![
                p.name.clone(),
                b.rate_per_second.to_string(),
                b.burst.to_string(),
                b.execute_cost.unwrap_or(1).to_string(),
                b.reconcile_cost.unwrap_or(1).to_string(),
                p.queues.join(","),
                format!("{}/{}", p.units_available, b.burst),
                span(&p.next_unit_in),
                in_flight,
                pause,
                time(&p.throttled_until),
                p.updated_by.clone(),
                p.pause_reason.clone(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "PROVIDER",
            "RATE/S",
            "BURST",
            "SEND_COST",
            "RECONCILE_COST",
            "QUEUES",
            "AVAILABLE",
            "NEXT_UNIT",
            "IN_FLIGHT",
            "PAUSED",
            "THROTTLED_UNTIL (UTC)",
            "CHANGED_BY",
            "PAUSE_REASON",
        ],
        &rows,
    )?;
    Ok(())
}

/// `providers list`.
fn providers(out: &mut dyn Write, all: &[proto::Provider], json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({ "providers": all.iter().map(provider_json).collect::<Vec<_>>() }),
        );
    }
    if all.is_empty() {
        writeln!(
            out,
            "no providers: every queue is unlimited (jobfence providers set NAME --rate R --burst B --queue Q --reason …)"
        )?;
        return Ok(());
    }
    provider_table(out, all)?;
    writeln!(
        out,
        "AVAILABLE: units that could be spent now, of the burst (database clock); IN_FLIGHT: running with a live lease[/cap]"
    )?;
    Ok(())
}

/// `providers set|delete|pause|resume`: what the change did, then the
/// provider as stored (as it was, for a delete).
fn provider_changed(
    out: &mut dyn Write,
    verb: &str,
    provider: Option<&proto::Provider>,
    json: bool,
) -> anyhow::Result<()> {
    let Some(p) = provider else {
        anyhow::bail!("the server answered without the provider");
    };
    if json {
        return print_json(
            out,
            &json!({ "action": verb, "provider": provider_json(p) }),
        );
    }
    let queues = if p.queues.is_empty() {
        "no queues".to_owned()
    } else {
        format!("queues {}", p.queues.join(", "))
    };
    let what = match (verb, pause_name(p.pause).as_str()) {
        ("deleted", _) => format!("{queues} no longer limited"),
        ("paused", "sends") => "sends held, reconciles go on".to_owned(),
        ("paused", _) => "nothing is handed out".to_owned(),
        ("resumed", _) => "hand-outs go on within the budget".to_owned(),
        _ => {
            let b = p.budget.unwrap_or_default();
            let mut caps = String::new();
            if let Some(share) = b.key_share {
                caps.push_str(&format!(
                    ", at most {}% a fairness key while others wait",
                    share * 100.0
                ));
            }
            if let Some(n) = b.max_in_flight_per_key {
                caps.push_str(&format!(", at most {n} in flight a fairness key"));
            }
            format!(
                "{}/s, burst {}{caps}, for {queues}",
                b.rate_per_second, b.burst
            )
        }
    };
    writeln!(out, "provider {} {verb}: {what}", p.name)?;
    provider_table(out, std::slice::from_ref(p))
}
