//! prefixgate as users run it: the release binary in a child process, configured by a
//! TOML file, on ports the OS picks; stopped when dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use gateway::config::BackendConfig;
use prefixgate_tests::{Answer, Client};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::fleet::{Fleet, repo_root};

/// A running prefixgate.
#[derive(Debug)]
pub struct Gateway {
    /// `http://127.0.0.1:PORT` of the API listener.
    pub url: String,
    /// `http://127.0.0.1:PORT` of the metrics and admin listener.
    pub admin: String,
    pub log: PathBuf,
    _child: tokio::process::Child,
}

/// The binary under test: `PREFIXGATE_BIN`, else the workspace's release build.
fn binary() -> PathBuf {
    std::env::var_os("PREFIXGATE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/release/prefixgate"))
}

/// `[[backends]]` tables for `backends`, with their KV-event endpoints.
pub fn backends_toml(backends: &[&BackendConfig]) -> String {
    let mut text = String::new();
    for b in backends {
        text.push_str(&format!(
            "[[backends]]\nname = {:?}\nurl = {:?}\nmodel = {:?}\n",
            b.name,
            b.url,
            b.model.as_deref().unwrap_or(super::fleet::MODEL)
        ));
        if let Some(events) = &b.kv_events {
            text.push_str(&format!("kv_events = {events:?}\n"));
        }
        if let Some(replay) = &b.kv_replay {
            text.push_str(&format!("kv_replay = {replay:?}\n"));
        }
    }
    text
}

impl Gateway {
    /// prefixgate in front of `backends`, with `extra` TOML (tables) after the defaults a
    /// test wants: quick health checks and engine scrapes.
    pub async fn start(
        fleet: &Fleet,
        name: &str,
        backends: &[&BackendConfig],
        extra: &str,
    ) -> Gateway {
        let config = format!(
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\n\
             [health]\ninterval_ms = 250\n[engine_scrape]\ninterval_ms = 100\n{extra}\n{}",
            backends_toml(backends)
        );
        let path = fleet.state.join(format!("gateway-{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let log = fleet.state.join(format!("gateway-{name}.log"));
        let mut child = tokio::process::Command::new(binary())
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "info")
            .env_remove("RUST_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (build it: cargo build --release -p gateway)",
                    binary().display()
                )
            });
        // The log goes to a file, and its "prefixgate listening on http://A (metrics on
        // http://B/metrics)" line tells the ports.
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (tell, listening) = tokio::sync::oneshot::channel();
        let file = log.clone();
        tokio::spawn(async move {
            let mut out = std::fs::File::create(&file).unwrap();
            let mut tell = Some(tell);
            while let Ok(Some(line)) = lines.next_line().await {
                use std::io::Write;
                let _ = writeln!(out, "{line}");
                if line.starts_with("prefixgate listening on ") {
                    if let Some(tell) = tell.take() {
                        let _ = tell.send(line);
                    }
                }
            }
        });
        let line = tokio::time::timeout(Duration::from_secs(30), listening)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "prefixgate did not start within 30 s (log: {})",
                    log.display()
                )
            })
            .unwrap_or_else(|_| {
                panic!(
                    "prefixgate exited at start: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("unexpected line: {line}"))
            .to_owned();
        let admin = line
            .rsplit_once("(metrics on ")
            .and_then(|(_, rest)| rest.strip_suffix("/metrics)"))
            .unwrap_or_else(|| panic!("unexpected line: {line}"))
            .to_owned();
        let gateway = Gateway {
            url,
            admin,
            log,
            _child: child,
        };
        gateway.wait_ready(backends.len()).await;
        gateway
    }

    /// Waits until `count` replicas are ready and their models known (bounded).
    async fn wait_ready(&self, count: usize) {
        let client = Client::new();
        for _ in 0..200 {
            let replicas = self.replicas(&client).await;
            let ready = replicas
                .as_array()
                .map(|list| {
                    list.iter()
                        .filter(|r| {
                            r["state"] == "ready"
                                && !r["models"].as_array().is_none_or(Vec::is_empty)
                        })
                        .count()
                })
                .unwrap_or(0);
            if ready >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "the gateway's replicas did not become ready: {}",
            self.replicas(&client).await
        );
    }

    /// `GET /admin/replicas`.
    pub async fn replicas(&self, client: &Client) -> serde_json::Value {
        client
            .call("GET", &format!("{}/admin/replicas", self.admin), &[], "")
            .await
            .json()
    }

    /// `GET /admin/replicas/NAME`.
    pub async fn replica(&self, client: &Client, name: &str) -> serde_json::Value {
        client
            .call(
                "GET",
                &format!("{}/admin/replicas/{name}", self.admin),
                &[],
                "",
            )
            .await
            .json()
    }

    /// `POST /admin/replicas`: adds `backend` to the gateway's set.
    pub async fn add_replica(&self, client: &Client, backend: &BackendConfig) {
        let body =
            serde_json::json!({"name": backend.name, "url": backend.url, "model": backend.model})
                .to_string();
        let added = client
            .call(
                "POST",
                &format!("{}/admin/replicas", self.admin),
                &[("content-type", "application/json")],
                body,
            )
            .await;
        assert_eq!(added.status, 201, "{}", added.text());
    }

    /// The gateway's `/metrics` text.
    pub async fn metrics(&self, client: &Client) -> String {
        client
            .call("GET", &format!("{}/metrics", self.admin), &[], "")
            .await
            .text()
            .to_owned()
    }

    /// POSTs a JSON body to `path`, and reads the whole answer.
    pub async fn post(
        &self,
        client: &Client,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        Answer::read(self.post_streaming(client, path, headers, body).await).await
    }

    /// POSTs a JSON body to `path` and returns at the response head, its body streaming.
    pub async fn post_streaming(
        &self,
        client: &Client,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> http::Response<hyper::body::Incoming> {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        client
            .send(
                "POST",
                &format!("{}{path}", self.url),
                &all,
                body.to_owned(),
            )
            .await
    }

    /// Waits (bounded) until no replica has a request outstanding in the gateway.
    pub async fn wait_outstanding_zero(&self, client: &Client) {
        for _ in 0..200 {
            let replicas = self.replicas(client).await;
            if replicas
                .as_array()
                .is_some_and(|list| list.iter().all(|r| r["outstanding"] == 0))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "outstanding requests never returned to 0: {}",
            self.replicas(client).await
        );
    }
}
