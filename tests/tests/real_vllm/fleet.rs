//! The real vLLM replicas a run of the suite stands on: the two `tests/real-vllm/start.sh`
//! started (named by `PREFIXGATE_REAL_VLLM_STATE`, its state directory), and any a test
//! starts for itself with [`OwnReplica`] (the SIGKILL test kills one).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gateway::config::{BackendConfig, GatewayConfig};
use prefixgate_tests::Client;

/// The model every replica serves (`--served-model-name`).
pub const MODEL: &str = "tiny";

/// The context every replica was started with (`--max-model-len`).
pub const MAX_MODEL_LEN: u32 = 2048;

/// What start.sh left in its state directory.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub state: PathBuf,
    /// As the gateway's `[[backends]]`, with each replica's KV-event endpoints.
    pub backends: Vec<BackendConfig>,
}

impl Fleet {
    /// The fleet of this run; panics with what to do when there is none.
    pub fn from_env() -> Fleet {
        let state = std::env::var_os("PREFIXGATE_REAL_VLLM_STATE")
            .map(PathBuf::from)
            .expect(
                "PREFIXGATE_REAL_VLLM_STATE is unset: run the suite with tests/real-vllm/run.sh, \
             which installs vLLM, starts two replicas and names their state directory",
            );
        let text = std::fs::read_to_string(state.join("backends.toml"))
            .unwrap_or_else(|e| panic!("{}/backends.toml: {e}", state.display()));
        let backends = GatewayConfig::from_toml_str(&text)
            .unwrap_or_else(|e| panic!("{}/backends.toml: {e}", state.display()))
            .backends;
        assert!(
            backends.len() >= 2,
            "the suite needs two replicas, start.sh gave {}",
            backends.len()
        );
        Fleet { state, backends }
    }

    pub fn a(&self) -> &BackendConfig {
        &self.backends[0]
    }

    pub fn b(&self) -> &BackendConfig {
        &self.backends[1]
    }

    /// The backend called `name`.
    pub fn named(&self, name: &str) -> &BackendConfig {
        self.backends
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no replica {name}"))
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.state.join(file))
            .unwrap_or_else(|e| panic!("{}/{file}: {e}", self.state.display()))
            .trim()
            .to_owned()
    }
}

/// One vLLM server's gauge from its own `/metrics` (summed over its engines).
pub async fn engine_gauge(client: &Client, url: &str, name: &str) -> f64 {
    let answer = client.call("GET", &format!("{url}/metrics"), &[], "").await;
    assert_eq!(answer.status, 200, "{url}/metrics");
    answer
        .text()
        .lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A replica started by one test and stopped (its whole process group) when dropped.
#[derive(Debug)]
pub struct OwnReplica {
    pub backend: BackendConfig,
    /// Its HTTP port.
    port: u16,
    pgid: u32,
    child: tokio::process::Child,
}

/// How long one start of a replica may take to answer /health: one normally answers within
/// 30 s here, so this is ten times that.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a replica did not come up.
enum StartupFailure {
    /// It exited; the end of its log, and whether the log says a port was in use (the
    /// engine process says so, far above the end, which is the API server's traceback).
    Exited { tail: String, lost_port: bool },
    /// It neither answered nor exited within [`STARTUP_TIMEOUT`]; the end of its log.
    Silent(String),
}

impl OwnReplica {
    /// Starts one more replica as start.sh does and waits (bounded) until it answers /health.
    /// A replica that exits during startup fails the test at once with the end of its log.
    /// Two failures of the harness rather than of vLLM get one more start on new ports (the
    /// first start's log kept as `NAME-first.log`): a port taken by another process between
    /// the pick and vLLM's bind (the ports are picked free, then released for vLLM to bind),
    /// and a start that neither answers nor exits within [`STARTUP_TIMEOUT`] (a CI run once
    /// waited 10 minutes on one, the single failure in its suite, and printed nothing of why).
    pub async fn start(fleet: &Fleet, name: &str) -> OwnReplica {
        let log_path = fleet.state.join(format!("{name}.log"));
        let mut replica = OwnReplica::spawn(fleet, name, &log_path);
        let first = match replica.wait_healthy(&log_path).await {
            Ok(()) => return replica,
            Err(StartupFailure::Exited {
                tail,
                lost_port: false,
            }) => panic!("{name} exited during startup; the end of its log:\n{tail}"),
            Err(StartupFailure::Exited { tail, .. }) => format!("it lost a port:\n{tail}"),
            Err(StartupFailure::Silent(log)) => format!(
                "it did not answer /health within {} s:\n{log}",
                STARTUP_TIMEOUT.as_secs()
            ),
        };
        eprintln!("{name}: starting it once more, as {first}");
        drop(replica); // kills its group
        let _ = std::fs::rename(&log_path, fleet.state.join(format!("{name}-first.log")));
        let mut replica = OwnReplica::spawn(fleet, name, &log_path);
        match replica.wait_healthy(&log_path).await {
            Ok(()) => replica,
            Err(StartupFailure::Exited { tail: log, .. }) => {
                panic!(
                    "{name} exited during its second start; the end of its log:\n{log}\n(first start: {first})"
                )
            }
            Err(StartupFailure::Silent(log)) => panic!(
                "{name} did not answer /health within {} s, twice; the end of its log:\n{log}\n(first start: {first})",
                STARTUP_TIMEOUT.as_secs()
            ),
        }
    }

    fn spawn(fleet: &Fleet, name: &str, log_path: &Path) -> OwnReplica {
        let ports = free_ports::<3>();
        let script = repo_root().join("tests/real-vllm/replica.sh");
        let log = std::fs::File::create(log_path).unwrap();
        let mut command = tokio::process::Command::new(script);
        command
            .arg(fleet.read("venv"))
            .arg(fleet.read("model"))
            .args(ports.iter().map(u16::to_string))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own group, so the API server and its engine processes die together.
            .process_group(0)
            .kill_on_drop(true);
        let child = command.spawn().expect("replica.sh starts");
        let pgid = child.id().expect("a pid");
        OwnReplica {
            backend: BackendConfig {
                name: name.to_owned(),
                url: format!("http://127.0.0.1:{}", ports[0]),
                model: Some(MODEL.to_owned()),
                kv_events: Some(format!("tcp://127.0.0.1:{}", ports[1])),
                kv_replay: Some(format!("tcp://127.0.0.1:{}", ports[2])),
            },
            port: ports[0],
            pgid,
            child,
        }
    }

    /// Waits until the replica answers /health, or exits, or [`STARTUP_TIMEOUT`] passes.
    async fn wait_healthy(&mut self, log_path: &Path) -> Result<(), StartupFailure> {
        let deadline = tokio::time::Instant::now() + STARTUP_TIMEOUT;
        loop {
            if healthy(self.port).await {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // The engine processes of its group may outlive the API server.
                signal_group(self.pgid, "KILL");
                let log = std::fs::read_to_string(log_path).unwrap_or_default();
                return Err(StartupFailure::Exited {
                    tail: format!("({status})\n{}", log_tail(log_path)),
                    lost_port: log.contains("Address already in use"),
                });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StartupFailure::Silent(log_tail(log_path)));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// SIGKILL to the replica's whole process group: a pod killed, an OOM, a node lost.
    pub fn kill(&self) {
        signal_group(self.pgid, "KILL");
    }

    /// SIGTERM to the API server alone, as Kubernetes stops a pod's container.
    pub fn terminate(&self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pgid.to_string())
            .status();
    }
}

impl Drop for OwnReplica {
    fn drop(&mut self) {
        signal_group(self.pgid, "KILL");
    }
}

fn signal_group(pgid: u32, signal: &str) {
    // std has no kill(2) without `unsafe`; kill(1) sends to a group given as -PGID.
    let _ = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stderr(Stdio::null())
        .status();
}

/// Whether `GET /health` on 127.0.0.1:`port` answers 200 (refused while vLLM starts).
async fn healthy(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        tcp.write_all(b"GET /health HTTP/1.1\r\nhost: vllm\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 12];
        tcp.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Some(true))
    )
}

/// `N` distinct free loopback ports: all held at once while picked, so none is given twice.
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}

/// The last 30 lines of a replica's log, for a failure message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("(unreadable: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The repository's root (this crate is `tests/`).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository")
}
