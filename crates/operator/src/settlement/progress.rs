//! The import's progress line on standard error: the lines sent so far,
//! and how the coordinator paces the import (it rests after each batch
//! while the workers' jobs run too slowly beside it, and says why), asked
//! once a second with ListSettlementImports by the import's own name.

use crate::connection::Authed;
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the line is written, and the coordinator asked.
const EVERY: Duration = Duration::from_secs(1);

/// A name for this import, to find it among the coordinator's running
/// ones: the process and the moment it started, unique enough for one
/// coordinator's imports of one provider.
pub(super) fn import_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}-{nanos:x}", std::process::id())
}

/// The progress line: `settlement: 120000 lines sent; yielding: …`.
pub(super) fn line(sent: u64, pace: Option<&str>) -> String {
    let lines = if sent == 1 { "line" } else { "lines" };
    match pace {
        Some(p) if !p.is_empty() => format!("settlement: {sent} {lines} sent; {p}"),
        _ => format!("settlement: {sent} {lines} sent"),
    }
}

/// The progress line of one import, written by a task of its own.
pub(super) struct Line(Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>);

impl Line {
    /// Starts writing the line of the import `header` names; `sent`: the
    /// lines sent so far.
    pub(super) fn start(
        client: JobAdminClient<Authed>,
        header: &proto::ImportSettlementHeader,
        sent: Arc<AtomicU64>,
    ) -> Line {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(show(
            client,
            header.provider.clone(),
            header.import_id.clone(),
            sent,
            stopped,
        ));
        Line(Some((stop, task)))
    }

    /// Writes the line a last time and ends it, so that what is printed
    /// next starts on a line of its own.
    pub(super) async fn end(&mut self) {
        if let Some((stop, task)) = self.0.take() {
            let _ = stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if let Some((stop, _)) = self.0.take() {
            let _ = stop.send(true);
        }
    }
}

/// Writes the progress line once a second (over itself) until `stop`
/// says the import ended, then once more and ends the line. A coordinator
/// that does not know ListSettlementImports (older) or cannot answer
/// leaves the pace out.
async fn show(
    mut client: JobAdminClient<Authed>,
    provider: String,
    import_id: String,
    sent: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) {
    let mut pace: Option<String> = None;
    let mut ask = true;
    let mut width = 0;
    let mut tick = tokio::time::interval(EVERY);
    tick.tick().await;
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.changed() => true,
        };
        if ask && !stopping {
            let asked = client
                .list_settlement_imports(proto::ListSettlementImportsRequest {
                    provider: provider.clone(),
                    import_id: import_id.clone(),
                })
                .await;
            match asked {
                Ok(r) => {
                    pace = r
                        .into_inner()
                        .imports
                        .into_iter()
                        .next()
                        .and_then(|i| i.pace)
                        .map(|p| p.summary);
                }
                Err(s) if s.code() == tonic::Code::Unimplemented => ask = false,
                Err(_) => pace = None,
            }
        }
        let text = line(sent.load(Ordering::Relaxed), pace.as_deref());
        // Spaces over what a longer line before left.
        eprint!("\r{text:width$}");
        width = width.max(text.len());
        if stopping || *stop.borrow() {
            eprintln!();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_the_lines_sent_and_the_pace() {
        assert_eq!(line(1, None), "settlement: 1 line sent");
        assert_eq!(line(4000, Some("")), "settlement: 4000 lines sent");
        assert_eq!(
            line(
                120_000,
                Some(
                    "yielding: the workers' jobs 40 % slower than alone, working 25 % of the time"
                )
            ),
            "settlement: 120000 lines sent; yielding: the workers' jobs 40 % slower than alone, \
             working 25 % of the time"
        );
    }

    #[test]
    fn import_ids_differ() {
        let a = import_id();
        std::thread::sleep(Duration::from_millis(1));
        assert_ne!(a, import_id());
    }
}
