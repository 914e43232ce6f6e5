//! The recorded changes of providers and queue policies, which `providers`
//! and `queue-policies` share: who makes a change and why
//! ([`ChangeArgs`], both recorded with it), and `providers history` /
//! `queue-policies history`, the record newest first.

use crate::connection::Authed;
use crate::refusal::refused;
use crate::render::{print_json, table, time};
use clap::Args;
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use serde_json::{json, Value};
use std::io::Write;

/// Who changes a provider or a policy, and why (both recorded).
#[derive(Debug, Args)]
pub struct ChangeArgs {
    /// Your name, recorded with the change. A coordinator that
    /// authenticates records your credential's name instead: leave this
    /// out, or give that same name (another is refused, OPERATOR_MISMATCH).
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
    /// Why; recorded with the change.
    #[arg(long)]
    pub reason: String,
}

/// Arguments of `providers history` and `queue-policies history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only the changes of this provider (or queue); all when left out.
    pub name: Option<String>,
    /// At most this many changes (1..=500).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Changes older than this change id (the next page).
    #[arg(long)]
    pub before: Option<u64>,
}

/// Runs `providers history` or `queue-policies history` for `subject`
/// (every subject when empty), printing to `out`.
pub(crate) async fn history(
    client: &mut JobAdminClient<Authed>,
    subject: String,
    h: HistoryArgs,
    out: &mut (dyn Write + Send),
    json: bool,
) -> anyhow::Result<()> {
    let changes = client
        .list_policy_changes(proto::ListPolicyChangesRequest {
            subject,
            limit: h.limit,
            before_change_id: h.before.unwrap_or(0),
        })
        .await
        .map_err(refused)?
        .into_inner();
    policy_changes(out, &changes, h.limit, json)
}

/// `providers history` and `queue-policies history`, newest first.
fn policy_changes(
    out: &mut dyn Write,
    page: &proto::ListPolicyChangesResponse,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let full = limit > 0 && page.changes.len() >= limit as usize;
    let next = page.changes.last().filter(|_| full).map(|c| c.change_id);
    if json {
        let changes: Vec<Value> = page
            .changes
            .iter()
            .map(|c| {
                json!({
                    "change_id": c.change_id,
                    "changed_at": time(&c.changed_at),
                    "operator": c.operator,
                    "subject": c.subject,
                    "action": c.action,
                    "reason": c.reason,
                    "detail": serde_json::from_str::<Value>(&c.detail)
                        .unwrap_or_else(|_| Value::String(c.detail.clone())),
                })
            })
            .collect();
        return print_json(out, &json!({ "changes": changes, "next_before": next }));
    }
    let rows: Vec<Vec<String>> = page
        .changes
        .iter()
        .map(|c| {
            vec![
                c.change_id.to_string(),
                time(&c.changed_at),
                c.operator.clone(),
                c.subject.clone(),
                c.action.clone(),
                c.reason.clone(),
                c.detail.clone(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "CHANGE", "AT (UTC)", "OPERATOR", "SUBJECT", "ACTION", "REASON", "DETAIL",
        ],
        &rows,
    )?;
    if let Some(id) = next {
        writeln!(out, "more: --before {id}")?;
    }
    Ok(())
}
