//! List and watch the selected pods, forever, feeding a [`PodTable`].
//!
//! Wire format (Kubernetes API, core/v1 pods):
//! - list: `GET /api/v1/namespaces/NS/pods?labelSelector=SEL` answers a `PodList`,
//!   `{"metadata":{"resourceVersion":"RV"},"items":[Pod,…]}`;
//! - watch: the same path with `watch=1&resourceVersion=RV&allowWatchBookmarks=true&
//!   timeoutSeconds=T` answers a stream of newline-delimited events
//!   `{"type":"ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR","object":…}`; the object is a
//!   Pod, for `BOOKMARK` a Pod with only `metadata.resourceVersion`, for `ERROR` a `Status`
//!   (`{"code":410,"reason":"Expired",…}`).
//!
//! Each event's `resourceVersion` is remembered, so a dropped or timed-out watch resumes from
//! the last one seen. `410 Gone` (as a status or an `ERROR` event) means that version is too
//! old: the pods are listed again and the table replaced. Any other `ERROR` event also
//! relists. A line that is not a valid event is logged and skipped. Every failure keeps the
//! last snapshot and retries after an exponential backoff (bounded by `backoff_max`), reset
//! once a watch has delivered events or stayed open a while, so a broken API server costs a
//! log line per backoff step, not a busy loop.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use serde::Deserialize;
use tokio::time::Instant;

use super::PodTable;
use super::api::{ApiResponse, ApiServer};
use super::pod::Pod;

/// A list body larger than this is refused (thousands of pods fit).
const MAX_LIST_BYTES: usize = 64 * 1024 * 1024;
/// One watch event line larger than this ends the watch (a pod is a few KiB).
const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;
/// Reading a whole list takes at most this long.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// A watch is abandoned this long after its `timeoutSeconds` if the server has not ended it.
const WATCH_MARGIN: Duration = Duration::from_secs(30);
/// A watch open this long was healthy even without events: the backoff starts over.
const HEALTHY_WATCH: Duration = Duration::from_secs(10);

/// What to watch and how to retry.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    pub namespace: String,
    pub selector: String,
    /// The server ends each watch after this long (`timeoutSeconds`); it is then resumed.
    pub watch_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl WatchSettings {
    fn list_path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/pods?labelSelector={}",
            encode(&self.namespace),
            encode(&self.selector)
        )
    }

    fn watch_path(&self, resource_version: &str) -> String {
        let mut path = format!(
            "{}&watch=1&allowWatchBookmarks=true&timeoutSeconds={}",
            self.list_path(),
            self.watch_timeout.as_secs().max(1)
        );
        if !resource_version.is_empty() {
            path.push_str("&resourceVersion=");
            path.push_str(&encode(resource_version));
        }
        path
    }
}

/// Exponential backoff: `initial`, doubling, at most `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            next: initial.min(max),
        }
    }

    /// The delay before the next attempt; each call doubles the following one.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
    }
}

/// Lists and watches forever; stopped by aborting the task.
pub async fn run(api: ApiServer, settings: WatchSettings, mut table: PodTable) {
    let mut backoff = Backoff::new(settings.backoff_initial, settings.backoff_max);
    loop {
        let mut resource_version = match list(&api, &settings).await {
            Ok((pods, resource_version)) => {
                tracing::debug!(pods = pods.len(), %resource_version, "pods listed");
                table.replace_all(pods);
                resource_version
            }
            Err(error) => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    api_server = %api.url(),
                    %error,
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot list pods; keeping the last replica set"
                );
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        loop {
            let started = Instant::now();
            let (end, events) =
                watch_once(&api, &settings, &mut resource_version, &mut table).await;
            if events > 0 || started.elapsed() >= HEALTHY_WATCH {
                backoff.reset();
            }
            let delay = backoff.next_delay();
            let retry_in_ms = delay.as_millis() as u64;
            match end {
                WatchEnd::Closed => {
                    tracing::debug!(%resource_version, events, "pod watch ended; resuming");
                }
                WatchEnd::Failed(error) => tracing::warn!(
                    %error,
                    %resource_version,
                    retry_in_ms,
                    "pod watch failed; resuming from the last resourceVersion, keeping the last replica set"
                ),
                WatchEnd::Relist(reason) => {
                    tracing::info!(%reason, retry_in_ms, "listing pods again");
                    tokio::time::sleep(delay).await;
                    break;
                }
            }
            tokio::time::sleep(delay).await;
        }
    }
}

/// The selected pods and the list's resourceVersion.
async fn list(api: &ApiServer, settings: &WatchSettings) -> Result<(Vec<Pod>, String), String> {
    let response = api
        .get(&settings.list_path())
        .await
        .map_err(|e| e.to_string())?;
    if !response.status.is_success() {
        return Err(status_error(response).await);
    }
    let body = tokio::time::timeout(LIST_TIMEOUT, response.collect(MAX_LIST_BYTES))
        .await
        .map_err(|_| format!("the pod list took over {} s", LIST_TIMEOUT.as_secs()))??;
    parse_list(&body)
}

#[derive(Debug, Default, Deserialize)]
struct PodList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: Option<String>,
}

/// A `PodList` body; an item that is not a pod is logged and left out.
fn parse_list(body: &[u8]) -> Result<(Vec<Pod>, String), String> {
    let list: PodList =
        serde_json::from_slice(body).map_err(|e| format!("the pod list is not a PodList: {e}"))?;
    let pods = list
        .items
        .into_iter()
        .filter_map(|item| match serde_json::from_value::<Pod>(item) {
            Ok(pod) if !pod.name().is_empty() => Some(pod),
            Ok(_) => {
                tracing::warn!("pod list item without metadata.name skipped");
                None
            }
            Err(error) => {
                tracing::warn!(%error, "pod list item skipped");
                None
            }
        })
        .collect();
    Ok((pods, list.metadata.resource_version.unwrap_or_default()))
}

/// How one watch connection ended.
#[derive(Debug, PartialEq, Eq)]
enum WatchEnd {
    /// The server ended the stream (its `timeoutSeconds`, or a closed connection).
    Closed,
    /// A connection or protocol failure; resume from the last resourceVersion.
    Failed(String),
    /// The resourceVersion expired or the server sent an error: list again.
    Relist(String),
}

/// One watch connection; the way it ended and how many events it applied.
async fn watch_once(
    api: &ApiServer,
    settings: &WatchSettings,
    resource_version: &mut String,
    table: &mut PodTable,
) -> (WatchEnd, usize) {
    let response = match api.get(&settings.watch_path(resource_version)).await {
        Ok(response) => response,
        Err(error) => return (WatchEnd::Failed(error.to_string()), 0),
    };
    if response.status == StatusCode::GONE {
        return (
            WatchEnd::Relist("410 Gone: resourceVersion too old".to_owned()),
            0,
        );
    }
    if !response.status.is_success() {
        return (WatchEnd::Failed(status_error(response).await), 0);
    }
    let deadline = Instant::now() + settings.watch_timeout + WATCH_MARGIN;
    let mut lines = LineReader::new(response.body, MAX_EVENT_BYTES);
    let mut events = 0;
    loop {
        let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Err(_) => {
                let error = "the server did not end the watch after timeoutSeconds".to_owned();
                return (WatchEnd::Failed(error), events);
            }
            Ok(Err(error)) => return (WatchEnd::Failed(error), events),
            Ok(Ok(None)) => return (WatchEnd::Closed, events),
            Ok(Ok(Some(line))) => line,
        };
        let event = match decode_event(&line) {
            Ok(event) => event,
            Err(error) => {
                let start = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                tracing::warn!(%error, line = %start, "malformed watch event skipped");
                continue;
            }
        };
        events += 1;
        match event {
            WatchEvent::Upsert(pod) => {
                remember(resource_version, &pod);
                table.upsert(&pod);
            }
            WatchEvent::Deleted(pod) => {
                remember(resource_version, &pod);
                table.remove(pod.name());
            }
            WatchEvent::Bookmark(version) => {
                if let Some(version) = version {
                    *resource_version = version;
                }
            }
            WatchEvent::Error { code, message } => {
                let reason = match code {
                    Some(410) => format!("410 Gone: {message}"),
                    Some(code) => format!("watch ERROR event {code}: {message}"),
                    None => format!("watch ERROR event: {message}"),
                };
                return (WatchEnd::Relist(reason), events);
            }
        }
    }
}

fn remember(resource_version: &mut String, pod: &Pod) {
    if let Some(version) = pod.metadata.resource_version.as_deref()
        && !version.is_empty()
    {
        version.clone_into(resource_version);
    }
}

/// A non-2xx response as a log message: status and the start of the body (the API server
/// says there what is wrong, e.g. which RBAC permission is missing).
async fn status_error(response: ApiResponse) -> String {
    let status = response.status;
    let body = tokio::time::timeout(Duration::from_secs(5), response.collect(64 * 1024))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    format!("HTTP {status}: {}", text.trim())
}

/// One decoded watch event.
#[derive(Debug)]
enum WatchEvent {
    Upsert(Box<Pod>),
    Deleted(Box<Pod>),
    Bookmark(Option<String>),
    Error { code: Option<u16>, message: String },
}

#[derive(Debug, Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

#[derive(Debug, Default, Deserialize)]
struct Status {
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    message: String,
}

fn decode_event(line: &[u8]) -> Result<WatchEvent, String> {
    let raw: RawEvent =
        serde_json::from_slice(line).map_err(|e| format!("not a watch event: {e}"))?;
    let RawEvent { kind, object } = raw;
    let pod = |object: serde_json::Value| -> Result<Box<Pod>, String> {
        let pod: Pod =
            serde_json::from_value(object).map_err(|e| format!("{kind} event: not a pod: {e}"))?;
        if pod.name().is_empty() {
            return Err(format!("{kind} event: pod without metadata.name"));
        }
        Ok(Box::new(pod))
    };
    match kind.as_str() {
        "ADDED" | "MODIFIED" => Ok(WatchEvent::Upsert(pod(object)?)),
        "DELETED" => Ok(WatchEvent::Deleted(pod(object)?)),
        "BOOKMARK" => Ok(WatchEvent::Bookmark(
            object
                .pointer("/metadata/resourceVersion")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
        )),
        "ERROR" => {
            let status: Status = serde_json::from_value(object).unwrap_or_default();
            Ok(WatchEvent::Error {
                code: status.code,
                message: status.message,
            })
        }
        other => Err(format!("unknown event type {other:?}")),
    }
}

/// Splits a streamed body into lines, holding at most `limit` bytes of one line.
#[derive(Debug)]
struct LineReader<B> {
    body: B,
    buffer: Vec<u8>,
    /// Bytes of `buffer` already searched for a newline.
    scanned: usize,
    limit: usize,
    ended: bool,
}

impl<B> LineReader<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    fn new(body: B, limit: usize) -> Self {
        LineReader {
            body,
            buffer: Vec::new(),
            scanned: 0,
            limit,
            ended: false,
        }
    }

    /// The next non-blank line (without its newline); `None` at the end of the body.
    async fn next_line(&mut self) -> Result<Option<Vec<u8>>, String> {
        loop {
            if let Some(offset) = self.buffer[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + offset;
                let line: Vec<u8> = self.buffer.drain(..=end).take(end).collect();
                self.scanned = 0;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            self.scanned = self.buffer.len();
            if self.ended {
                let rest = std::mem::take(&mut self.buffer);
                self.scanned = 0;
                return Ok((!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest));
            }
            if self.buffer.len() > self.limit {
                return Err(format!("a watch event longer than {} bytes", self.limit));
            }
            match self.body.frame().await {
                None => self.ended = true,
                Some(Err(error)) => return Err(format!("the watch stream broke: {error}")),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// Percent-encodes a query value (everything but RFC 3986's unreserved characters).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    fn body(
        chunks: Vec<&'static str>,
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, String>> + Unpin> {
        StreamBody::new(stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))),
        ))
    }

    #[tokio::test]
    async fn lines_are_split_across_chunks_and_blank_lines_skipped() {
        let mut reader =
            LineReader::new(body(vec!["{\"a\":", "1}\n\n{\"b\"", ":2}\n", "tail"]), 100);
        assert_eq!(reader.next_line().await.unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(reader.next_line().await.unwrap().unwrap(), b"{\"b\":2}");
        assert_eq!(reader.next_line().await.unwrap().unwrap(), b"tail");
        assert_eq!(reader.next_line().await.unwrap(), None);
    }

    #[tokio::test]
    async fn an_endless_line_is_an_error() {
        let mut reader = LineReader::new(body(vec!["0123456789", "0123456789", "x\n"]), 12);
        assert!(
            reader
                .next_line()
                .await
                .unwrap_err()
                .contains("longer than 12")
        );
    }

    #[test]
    fn events_decode_by_type() {
        let added = br#"{"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"7"}}}"#;
        assert!(matches!(decode_event(added), Ok(WatchEvent::Upsert(p)) if p.name() == "p"));
        let deleted = br#"{"type":"DELETED","object":{"metadata":{"name":"p"}}}"#;
        assert!(matches!(decode_event(deleted), Ok(WatchEvent::Deleted(_))));
        let bookmark =
            br#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"12"}}}"#;
        assert!(matches!(decode_event(bookmark), Ok(WatchEvent::Bookmark(Some(v))) if v == "12"));
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version: 1 (5)"}}"#;
        assert!(matches!(
            decode_event(gone),
            Ok(WatchEvent::Error {
                code: Some(410),
                ..
            })
        ));
    }

    #[test]
    fn malformed_events_are_errors_not_panics() {
        for line in [
            &b"not json"[..],
            br#"{"type":"ADDED"}"#,
            br#"{"type":"ADDED","object":{"metadata":{}}}"#,
            br#"{"type":"MODIFIED","object":{"metadata":{"name":5}}}"#,
            br#"{"type":"RENAMED","object":{}}"#,
            br#"[1,2]"#,
        ] {
            assert!(
                decode_event(line).is_err(),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn a_list_skips_items_that_are_not_pods() {
        let body = br#"{"kind":"PodList","metadata":{"resourceVersion":"99"},"items":[
            {"metadata":{"name":"a"}}, {"metadata":{"name":["x"]}}, {"metadata":{}}]}"#;
        let (pods, version) = parse_list(body).unwrap();
        assert_eq!(version, "99");
        assert_eq!(pods.len(), 1);
        assert!(parse_list(b"<html>").unwrap_err().contains("PodList"));
    }

    #[test]
    fn backoff_doubles_up_to_the_bound_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let delays: Vec<u128> = (0..5).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(delays, [100, 200, 350, 350, 350]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn paths_encode_the_selector_and_resume_from_the_version() {
        let settings = WatchSettings {
            namespace: "llm".to_owned(),
            selector: "model.aibrix.ai/name in (a,b)".to_owned(),
            watch_timeout: Duration::from_secs(290),
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(1),
        };
        assert_eq!(
            settings.list_path(),
            "/api/v1/namespaces/llm/pods?labelSelector=model.aibrix.ai%2Fname%20in%20%28a%2Cb%29"
        );
        let watch = settings.watch_path("123");
        assert!(
            watch.ends_with(
                "&watch=1&allowWatchBookmarks=true&timeoutSeconds=290&resourceVersion=123"
            ),
            "{watch}"
        );
        assert!(!settings.watch_path("").contains("resourceVersion"));
    }
}
