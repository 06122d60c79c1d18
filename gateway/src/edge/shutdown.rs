//! Waiting for the operator's stop signal (SIGTERM or SIGINT).
//!
//! `main` registers the handlers **before** it starts serving (a signal that arrived between
//! "listening" and registration would otherwise kill the process with in-flight streams),
//! waits here, then asks the [`crate::GatewayHandle`] to drain within the grace period. Kept
//! apart from the server so tests can stop a gateway without signals.

/// Registered SIGTERM and SIGINT handlers.
#[derive(Debug)]
pub struct StopSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Registers the handlers; from now on the signals no longer end the process.
    #[cfg(unix)]
    pub fn register() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Registers nothing: Ctrl-C is awaited directly.
    #[cfg(not(unix))]
    pub fn register() -> std::io::Result<Self> {
        Ok(StopSignals {})
    }

    /// Resolves on the first SIGTERM or SIGINT; the signal's name.
    #[cfg(unix)]
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }

    /// Resolves on Ctrl-C.
    #[cfg(not(unix))]
    pub async fn recv(&mut self) -> &'static str {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}
