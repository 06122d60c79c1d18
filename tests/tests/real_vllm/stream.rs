//! Reading a streamed answer as a client does: frame by frame, up to a point, or to its end.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;

/// A streamed answer being read.
#[derive(Debug)]
pub struct Stream {
    pub target_pod: String,
    body: Incoming,
    /// Everything read so far.
    pub text: String,
}

impl Stream {
    pub fn new(response: http::Response<Incoming>) -> Stream {
        assert_eq!(response.status(), 200, "a streamed answer");
        let target_pod = response
            .headers()
            .get("target-pod")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Stream {
            target_pod,
            body: response.into_body(),
            text: String::new(),
        }
    }

    /// Reads until `count` SSE events have arrived (bounded: 60 s); false if the stream
    /// ended first.
    pub async fn read_events(&mut self, count: usize) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.events().len() < count {
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.text.push_str(&String::from_utf8_lossy(&data));
                    }
                }
                Ok(Some(Err(_)) | None) => return false,
                Err(_) => panic!("no {count} events within 60 s: {}", self.text),
            }
        }
        true
    }

    /// Reads to the end (bounded: 120 s); what arrived in all.
    pub async fn finish(mut self) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.text.push_str(&String::from_utf8_lossy(&data));
                    }
                }
                Ok(Some(Err(error))) => panic!("the stream broke: {error}; read: {}", self.text),
                Ok(None) => return self.text,
                Err(_) => panic!("the stream did not end within 120 s: {}", self.text),
            }
        }
    }

    /// The complete events read so far.
    pub fn events(&self) -> Vec<&str> {
        events(&self.text)
    }
}

/// The complete SSE events of `text` (a trailing partial event left out).
pub fn events(text: &str) -> Vec<&str> {
    let complete = text.rfind("\n\n").map_or("", |end| &text[..end]);
    complete.split("\n\n").filter(|e| !e.is_empty()).collect()
}

/// The JSON payloads of the `data:` events (`[DONE]` left out).
pub fn payloads(text: &str) -> Vec<serde_json::Value> {
    events(text)
        .into_iter()
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// The usage block of a streamed answer (its chunk with `choices: []`).
pub fn stream_usage(text: &str) -> Option<serde_json::Value> {
    payloads(text)
        .into_iter()
        .find(|p| p["choices"].as_array().is_some_and(Vec::is_empty) && p["usage"].is_object())
        .map(|p| p["usage"].clone())
}
