//! The workers the coordinators saw (ListWorkers, docs/operating.md
//! "Workers"), read at the end of the run: each worker with the client
//! its user-agent named, and the coordinators that served them.

use super::cluster::Cluster;
use super::credentials;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::ListWorkersRequest;
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The report's line; `None` when the coordinators could not say.
#[derive(Debug, Default)]
pub struct WorkersSeen {
    line: Option<String>,
}

/// Asks the coordinators (through the load balancer, as the console's
/// operator) which workers they saw in the last hour.
pub(super) async fn read(cluster: &Cluster) -> WorkersSeen {
    match list(cluster).await {
        Ok(line) => WorkersSeen { line: Some(line) },
        Err(e) => WorkersSeen {
            line: Some(format!("not read: {e:#}")),
        },
    }
}

async fn list(cluster: &Cluster) -> anyhow::Result<String> {
    let credentials = cluster.client(credentials::CONSOLE)?;
    let channel = credentials
        .endpoint(format!("http://{}", cluster.coordinators.addr))?
        .connect()
        .await?;
    let mut admin = JobAdminClient::with_interceptor(channel, credentials.authorization());
    let workers = admin
        .list_workers(ListWorkersRequest {
            within: Some(prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow::anyhow!(jobfence_operator::describe_status(&s)))?
        .into_inner()
        .workers;
    let coordinators: BTreeSet<&str> = workers.iter().map(|w| w.coordinator.as_str()).collect();
    let each: Vec<String> = workers
        .iter()
        .map(|w| format!("{} ({})", w.worker_id, w.client))
        .collect();
    Ok(format!(
        "{}, last served by {}: {}",
        workers.len(),
        coordinators.into_iter().collect::<Vec<_>>().join(" and "),
        each.join(", ")
    ))
}

impl WorkersSeen {
    /// The report's line, when there is one.
    pub fn render(&self, s: &mut String) {
        if let Some(line) = &self.line {
            let _ = writeln!(s, "  workers seen            {line}");
        }
    }
}
