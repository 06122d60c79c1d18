//! A real `redis-server` on a free loopback port, for the cluster-sharing tests.
//!
//! The binary is `$PREFIXGATE_REDIS_SERVER`, else `redis-server` on the `PATH`. A missing
//! binary fails the test with a message saying how to install it: the tests that need it are
//! `#[ignore]`d so that `cargo test --workspace` passes without Redis, and `.ci/run`
//! installs Redis and runs them, checking that each ran and passed.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use super::DEADLINE;

/// A running server; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

impl RedisServer {
    /// Starts a server without persistence on a free loopback port and waits until it
    /// answers `PING`.
    pub async fn start() -> RedisServer {
        // Another process can take the port between this probe and the server's bind; then
        // the server exits and a new port is tried.
        for _ in 0..5 {
            let port = free_port();
            let mut server = RedisServer {
                child: Some(spawn(port)),
                port,
            };
            if server.answers().await {
                return server;
            }
            server.stop().await;
        }
        panic!("redis-server did not start on a free loopback port in 5 tries");
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (the stream and everything in it is gone).
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts a fresh, empty server on the same port.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.child = Some(spawn(self.port));
        assert!(
            self.answers().await,
            "redis-server did not restart on port {}",
            self.port
        );
    }

    /// Waits (bounded) for `PING` to be answered; false if the server exited first.
    async fn answers(&mut self) -> bool {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while tokio::time::Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_exited)) = child.try_wait()
            {
                return false;
            }
            if ping(self.port).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}

fn binary() -> String {
    std::env::var("PREFIXGATE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

fn spawn(port: u16) -> Child {
    let binary = binary();
    Command::new(&binary)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run {binary} ({error}): these tests need a Redis server; install it \
                 (apt-get install -y redis-server) or set PREFIXGATE_REDIS_SERVER to its path"
            )
        })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

async fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if stream.write_all(b"PING\r\n").await.is_err() {
        return false;
    }
    let mut answer = [0u8; 7];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), stream.read_exact(&mut answer)).await,
        Ok(Ok(_)) if &answer == b"+PONG\r\n"
    )
}
