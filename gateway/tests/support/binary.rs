//! The `prefixgate` binary run as a user runs it: a child process with the given arguments,
//! its listeners' addresses read from the lines it logs once it listens.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Bound on the binary's start: it builds embedded replicas and probes them first.
const START: Duration = Duration::from_secs(60);

/// The running binary and where it listens (`host:port`, no scheme).
pub struct Running {
    pub child: Child,
    pub api: String,
    pub metrics: String,
    /// The ext_proc listener's address, when the arguments asked for one.
    pub ext_proc: Option<String>,
}

/// Starts `prefixgate ARGS…` and returns once it has logged its HTTP listener (and, with
/// `ext_proc`, its ext_proc listener too). The rest of its log is read and dropped, so it
/// cannot fill the pipe and block the binary.
pub async fn start(args: &[&str], ext_proc: bool) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_prefixgate"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("prefixgate starts");
    let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
    let (api, metrics, ext_proc) = tokio::time::timeout(START, async {
        let mut listening = None;
        let mut ext_proc_listening = None;
        while let Some(line) = lines.next_line().await.expect("prefixgate's log") {
            // "prefixgate listening on http://A (metrics on http://B/metrics)"
            if let Some(rest) = line.strip_prefix("prefixgate listening on http://") {
                let mut words = rest.split_whitespace();
                let api = words.next().expect("the API address").to_owned();
                let metrics = words
                    .nth(2)
                    .expect("the metrics address")
                    .trim_start_matches("http://")
                    .trim_end_matches("/metrics)")
                    .to_owned();
                listening = Some((api, metrics));
            }
            if let Some(rest) = line.strip_prefix("prefixgate ext_proc listening on ") {
                ext_proc_listening = Some(rest.trim().to_owned());
            }
            if let Some((api, metrics)) = &listening
                && (!ext_proc || ext_proc_listening.is_some())
            {
                return (api.clone(), metrics.clone(), ext_proc_listening);
            }
        }
        panic!("prefixgate exited before it listened");
    })
    .await
    .expect("prefixgate did not start in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Running {
        child,
        api,
        metrics,
        ext_proc,
    }
}
