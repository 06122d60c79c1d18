//! Waiting for the operator's stop signal (SIGTERM or SIGINT).
//!
//! `main` waits here, then asks the [`crate::GatewayHandle`] to drain within the grace
//! period. Kept apart from the server so tests can stop a gateway without signals.

/// Resolves on the first SIGTERM or SIGINT; the signal's name.
#[cfg(unix)]
pub async fn stop_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        _ = int.recv() => Ok("SIGINT"),
    }
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub async fn stop_signal() -> std::io::Result<&'static str> {
    tokio::signal::ctrl_c().await?;
    Ok("Ctrl-C")
}
