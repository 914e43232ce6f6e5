//! The demo's last step (docs/design.md rule 15): the product's own
//! settlement. The demo gives the fake provider's `fake` preset to its
//! provider, fetches the provider's report (CSV, every refund it made),
//! imports it with `jobfence settlement import` as an operator would from
//! cron, and reads back what the coordinator matched and raised. Any
//! exception makes the invariant fail. `--inject-settlement-exceptions`
//! first makes the provider refund one operation a second time and make a
//! refund by hand: the report must then show exactly those two
//! exceptions.

use super::cluster::Cluster;
use super::{budget, credentials, say, DemoArgs};
use anyhow::{Context, Result};
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_fake_provider::model::RefundParams;
use std::path::Path;

/// The operation key of the refund the injection makes by hand.
pub const HAND_MADE_KEY: &str = "made-by-hand-in-the-dashboard";

/// What settlement found, for the report.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    /// The import's summary, as the command printed it (JSON).
    pub summary: serde_json::Value,
    /// The exceptions not resolved: (kind, subject).
    pub exceptions: Vec<(String, String)>,
    /// What the injection did (empty without it).
    pub injected: Vec<String>,
    /// Why settlement did not run, if it did not.
    pub skipped: Option<String>,
}

/// Runs the demo's settlement over the first (only) database's provider.
pub(super) async fn run(cluster: &Cluster, args: &DemoArgs, work_dir: &Path) -> Result<Settled> {
    if args.no_budget || cluster.queues.len() > 1 {
        return Ok(Settled {
            skipped: Some(if args.no_budget {
                "not run: with --no-budget the demo has no provider to settle".into()
            } else {
                "not run: with --shards each database has a provider of its own, and the fake \
                 provider one report for all of them"
                    .into()
            }),
            ..Settled::default()
        });
    }
    let credentials = cluster.client(credentials::CONSOLE)?;
    let channel = credentials
        .endpoint(format!("http://{}", cluster.coordinators.addr))?
        .connect()
        .await
        .context("connecting to the coordinators for the settlement")?;
    let mut admin = JobAdminClient::with_interceptor(channel, credentials.authorization());
    let refused = |s: tonic::Status| anyhow::anyhow!(jobfence_operator::describe_status(&s));
    configure(&mut admin, cluster).await?;
    let injected = if args.inject_settlement_exceptions {
        inject(cluster).await?
    } else {
        Vec::new()
    };
    let report = work_dir.join("settlement-report.csv");
    let mut file = std::fs::File::create(&report)?;
    cluster
        .provider_client
        .report(None, None, "csv", &mut file)
        .await
        .context("fetching the fake provider's settlement report")?;
    drop(file);
    say("importing the provider's settlement report (jobfence settlement import)");
    let summary = import(cluster, &report).await?;
    let exceptions = admin
        .list_settlement_exceptions(proto::ListSettlementExceptionsRequest {
            provider: budget::PROVIDER.into(),
            limit: 500,
            ..Default::default()
        })
        .await
        .map_err(refused)?
        .into_inner()
        .exceptions
        .into_iter()
        .map(|e| (e.kind, e.subject))
        .collect();
    Ok(Settled {
        summary,
        exceptions,
        injected,
        skipped: None,
    })
}

/// A second refund of one refunded operation, and a refund by hand.
/// Stores the fake provider's settlement settings through the load
/// balancer. Right after the demo's last fault (the database cut), the
/// load balancer may not have put a coordinator back yet: UNAVAILABLE is
/// asked again for up to 30 s, as any operator's script would.
async fn configure(
    admin: &mut JobAdminClient<
        tonic::service::interceptor::InterceptedService<
            tonic::transport::Channel,
            jobfence_worker::credentials::Authorization,
        >,
    >,
    cluster: &Cluster,
) -> Result<()> {
    let refused = |s: tonic::Status| anyhow::anyhow!(jobfence_operator::describe_status(&s));
    let settings = proto::PutSettlementSettingsRequest {
        provider: budget::PROVIDER.into(),
        preset: "fake".into(),
        lag: Some(prost_types::Duration::default()),
        queues: vec![proto::QueueAmountPointers {
            queue: cluster.queues[0].clone(),
            amount_pointer: "/amount".into(),
            currency_pointer: "/currency".into(),
        }],
        operator: credentials::CONSOLE.into(),
        reason: "jobfence demo: read the fake provider's report".into(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    loop {
        match admin.put_settlement_settings(settings.clone()).await {
            Ok(_) => break,
            Err(s)
                if s.code() == tonic::Code::Unavailable
                    && started.elapsed() < std::time::Duration::from_secs(30) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(s) => return Err(refused(s)).context("storing the provider's settlement settings"),
        }
    }
    Ok(())
}

async fn inject(cluster: &Cluster) -> Result<Vec<String>> {
    let ledger = cluster.provider_client.ledger().await?;
    let key = ledger
        .merchant_references
        .iter()
        .find(|(_, e)| e.refunds == 1 && e.pending == 0)
        .map(|(k, _)| k.clone())
        .context("no refunded operation to refund twice")?;
    cluster.provider_client.refund_again(&key).await?;
    cluster
        .provider_client
        .refund_outside(&RefundParams {
            payment_id: "pay_by_hand".into(),
            amount: 4200,
            currency: "TWD".into(),
            merchant_reference: HAND_MADE_KEY.into(),
        })
        .await?;
    Ok(vec![
        format!("the provider refunded {key} a second time"),
        format!("a refund made by hand in the provider's dashboard ({HAND_MADE_KEY})"),
    ])
}

/// `jobfence settlement import`, as an operator's cron job runs it; its
/// JSON summary.
async fn import(cluster: &Cluster, report: &Path) -> Result<serde_json::Value> {
    let mut cmd = tokio::process::Command::new(&cluster.exe);
    cmd.args(["settlement", "import", "--provider", budget::PROVIDER])
        // Every job of the demo, which has finished them all: a report
        // covers a period that has ended.
        .args([
            "--from",
            "2000-01-01",
            "--to",
            &chrono::Utc::now().to_rfc3339(),
            "--json",
        ])
        .arg("--endpoint")
        .arg(&cluster.coordinators.addr)
        .arg(report)
        .envs(cluster.client_env(credentials::CONSOLE))
        .env_remove("JOBFENCE_ENDPOINT")
        .env_remove("JOBFENCE_COORDINATOR")
        .stdin(std::process::Stdio::null());
    let out = cmd
        .output()
        .await
        .context("running jobfence settlement import")?;
    // Exit 1 with a summary: lines were refused, the rest imported; the
    // report counts them ("refused as unreadable").
    let summary = serde_json::from_slice::<serde_json::Value>(&out.stdout);
    match (out.status.code(), summary) {
        (Some(0 | 1), Ok(summary)) => Ok(summary),
        _ => anyhow::bail!(
            "jobfence settlement import failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

impl Settled {
    /// The report's settlement lines.
    pub fn render(&self, s: &mut String) {
        use std::fmt::Write;
        if let Some(why) = &self.skipped {
            let _ = writeln!(s, "  settlement              {why}");
            return;
        }
        for (i, what) in self.injected.iter().enumerate() {
            let head = if i == 0 { "settlement injected" } else { "" };
            let _ = writeln!(s, "  {head:<23} {what}");
        }
        let n = |k: &str| self.summary[k].as_u64().unwrap_or(0);
        let _ = writeln!(
            s,
            "  settlement              {} report lines: {} new, {} refused; {} matched, {} not settled (pending or failed)",
            n("lines_read"),
            n("lines_new"),
            n("lines_refused"),
            n("matched"),
            n("undecided")
        );
        let resolved: Vec<String> = self.summary["resolved_job_ids"]
            .as_array()
            .map(|a| a.iter().map(|v| v.to_string()).collect())
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  settlement resolved     {}",
            if resolved.is_empty() {
                "no manual review".to_owned()
            } else {
                format!("manual reviews of jobs {}", resolved.join(", "))
            }
        );
        let listed = if self.exceptions.is_empty() {
            "none".to_owned()
        } else {
            self.exceptions
                .iter()
                .map(|(k, subject)| format!("{k} {subject}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(s, "  settlement exceptions   {listed}");
    }
}
