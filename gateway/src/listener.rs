//! The accept loop: HTTP/1 connections with TCP_NODELAY, each served in its own task, with
//! a graceful drain that the gateway can cut short.
//!
//! axum's own `serve` detaches connection tasks, so a drain could not be cut at its deadline;
//! here the connections live in a [`JoinSet`] owned by the accept task. On stop the loop
//! stops accepting, asks every connection to finish its in-flight response and close, and
//! waits for them; aborting the task (at the end of the grace period) drops the set, which
//! aborts every connection, drops their response bodies and so releases their outstanding
//! guards.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tower::ServiceExt;

/// A client that sends no complete request head for this long is disconnected.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `stop` turns true, then drains.
pub fn spawn(
    listener: TcpListener,
    router: Router,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        let for_connections = stop.clone();
        // An error means the handle is gone: stop too.
        let stopping = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        tokio::pin!(stopping);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _peer)) => {
                        // Streamed tokens are small writes; Nagle would hold them back.
                        if let Err(error) = tcp.set_nodelay(true) {
                            tracing::debug!(%error, "cannot set TCP_NODELAY");
                        }
                        connections.spawn(serve_connection(
                            tcp,
                            router.clone(),
                            for_connections.clone(),
                        ));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
                () = &mut stopping => break,
            }
            // Reap finished connections so the set does not grow with the connection count.
            while connections.try_join_next().is_some() {}
        }
        drop(listener);
        while connections.join_next().await.is_some() {}
    })
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    router: Router,
    mut stop: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let router = router.clone();
        async move { router.oneshot(request.map(Body::new)).await }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(connection);
    let stopping = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopping);
    let mut draining = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = &mut stopping, if !draining => {
                draining = true;
                // Finish the response in flight, then close instead of keeping alive.
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}
