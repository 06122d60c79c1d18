//! Which spans and events the log layer (stderr) takes.
//!
//! The level comes from the `log_level` setting (validated with the configuration), else
//! `RUST_LOG`, else `info` without kube's per-request trace layer, which logs every failed
//! API request at ERROR although discovery already logs each failure once, with its retry
//! delay.
//!
//! The request path's spans ([`super::span`]) are for traces, and the log layer takes them
//! only when it logs the gateway's debug events: those (an attempt that failed, a refusal)
//! are logged inside them and take their `request_id` from them. At `info` no event is
//! logged inside one, yet a formatting layer formats every span's fields as it opens and as
//! they are recorded: about a tenth of prefixgate's own CPU per request
//! (docs/PERFORMANCE.md, issue 29).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FilterExt as _, LevelFilter, filter_fn};
use tracing_subscriber::layer::Filter;

/// The log layer's filter for `setting` (the `log_level` setting, if any).
pub fn filter<S>(setting: Option<&str>) -> impl Filter<S> + use<S> {
    let levels = setting
        .and_then(|filter| EnvFilter::try_new(filter).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info,kube_client::client::builder=off"));
    let debug = levels
        .max_level_hint()
        .is_none_or(|level| level >= LevelFilter::DEBUG);
    levels.and(filter_fn(move |meta| {
        debug || !(meta.is_span() && meta.target() == super::span::TARGET)
    }))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing::subscriber::Interest;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::Registry;
    use tracing_subscriber::layer::{Filter, SubscriberExt as _};

    use super::filter;
    use crate::telemetry::span;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the log layer writes at `level` for an event at `info` and one at `debug`
    /// inside a request's span.
    fn logged_at(level: &str) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let logs = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(filter(Some(level)));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(logs), || {
            let request = span::request("/v1/chat/completions", "req-7");
            let _inside = request.enter();
            tracing::info!("an info event");
            tracing::debug!("a debug event");
        });
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    /// How the filter at `level` answers for the request span's call site: `never` lets
    /// tracing skip the span altogether when no other layer wants it.
    fn request_span_interest(level: &str) -> Interest {
        let everything = tracing_subscriber::registry();
        let metadata = tracing::subscriber::with_default(everything, || {
            span::request("/", "r")
                .metadata()
                .expect("a registry alone takes every span")
        });
        Filter::<Registry>::callsite_enabled(&filter::<Registry>(Some(level)), metadata)
    }

    #[test]
    fn at_info_the_request_span_is_left_out() {
        assert!(request_span_interest("info").is_never());
        let text = logged_at("info");
        assert!(text.contains("an info event"), "{text}");
        assert!(!text.contains("req-7"), "{text}");
        assert!(!text.contains("a debug event"), "{text}");
    }

    #[test]
    fn at_debug_events_carry_the_request_span() {
        assert!(!request_span_interest("gateway=debug").is_never());
        let text = logged_at("gateway=debug");
        assert!(text.contains("request_id=\"req-7\""), "{text}");
        assert!(text.contains("a debug event"), "{text}");
    }

    #[test]
    fn other_spans_are_logged_as_before() {
        let out = Captured::default();
        let writer = out.clone();
        let logs = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(filter(Some("info")));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(logs), || {
            let _drain = tracing::info_span!("drain", replica = "a").entered();
            tracing::info!("draining");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("drain{replica=\"a\"}"), "{text}");
    }
}
