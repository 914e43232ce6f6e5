//! The process's own signals: what stops `serve`, the fake provider, the
//! demo and a refund worker.

/// Completes on SIGTERM or Ctrl-C (SIGINT).
///
/// A signal whose handler cannot be installed is logged and then never
/// completes: before, a failed Ctrl-C handler completed at once and shut a
/// server down the moment it started. The other signal still stops the
/// process.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C; SIGTERM still stops the process");
            std::future::pending::<()>().await
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C still stops the process");
                std::future::pending::<()>().await
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
