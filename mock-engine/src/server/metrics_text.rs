//! `/metrics`: the engine's counters, gauges and histograms in the Prometheus text format,
//! with vLLM 0.11's names, types, labels and bucket bounds (reference §2).
//!
//! Labels are `{engine="0",model_name="…"}` and every label set is printed sorted (as
//! prometheus_client does, so `le` and `finished_reason` sit between `engine` and
//! `model_name`). Counters are declared without `_total` in `# TYPE` and sampled with it.
//! Values are written as floats (`3.0`). Not written: the `_created` samples, Python
//! process metrics and the HTTP instrumentator's `http_*` series. The deprecated
//! `vllm:gpu_cache_usage_perc` is written beside `vllm:kv_cache_usage_perc` because older
//! routers scrape it. Times are engine seconds.

use std::fmt::Write;

use crate::model::{EngineMetrics, EngineModel, FinishReason, Histogram};

/// What one scrape reports: a copy taken under the driver's lock, rendered outside it.
#[derive(Debug, Clone)]
pub struct MetricsSnapshot {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub metrics: EngineMetrics,
}

impl MetricsSnapshot {
    /// Copies what `/metrics` needs out of the model.
    pub fn of(model: &EngineModel) -> Self {
        MetricsSnapshot {
            running: model.num_running(),
            waiting: model.num_waiting(),
            kv_usage: model.kv_usage(),
            block_size: model.profile().block_size,
            num_gpu_blocks: model.profile().num_gpu_blocks,
            metrics: model.metrics().clone(),
        }
    }
}

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders a scrape for the served `model_name`.
pub fn render(snapshot: &MetricsSnapshot, model_name: &str) -> String {
    let mut out = Exposition {
        text: String::with_capacity(16 * 1024),
        model: escape(model_name),
    };
    let m = &snapshot.metrics;
    out.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        snapshot.running as f64,
    );
    out.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        snapshot.waiting as f64,
    );
    out.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        snapshot.kv_usage,
    );
    out.gauge(
        "vllm:gpu_cache_usage_perc",
        "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: use vllm:kv_cache_usage_perc.",
        snapshot.kv_usage,
    );
    out.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        m.prefix_cache_queries,
    );
    out.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        m.prefix_cache_hits,
    );
    out.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        m.preemptions,
    );
    out.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        m.prompt_tokens,
    );
    out.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        m.generation_tokens,
    );
    out.request_success(m);
    let histograms: [(&str, &str, &Histogram); 9] = [
        (
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            &m.iteration_tokens,
        ),
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &m.ttft,
        ),
        (
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds. DEPRECATED: use vllm:inter_token_latency_seconds.",
            &m.inter_token_latency,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &m.inter_token_latency,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &m.e2e_request_latency,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &m.request_queue_time,
        ),
        (
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            &m.request_inference_time,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &m.request_prefill_time,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &m.request_decode_time,
        ),
    ];
    for (name, help, histogram) in histograms {
        out.histogram(name, help, histogram);
    }
    out.cache_config_info(snapshot);
    out.text
}

struct Exposition {
    text: String,
    model: String,
}

impl Exposition {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, help, "gauge");
        let _ = writeln!(
            self.text,
            "{name}{{engine=\"0\",model_name=\"{}\"}} {}",
            self.model,
            float(value)
        );
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, help, "counter");
        let _ = writeln!(
            self.text,
            "{name}_total{{engine=\"0\",model_name=\"{}\"}} {}",
            self.model,
            float(value as f64)
        );
    }

    fn request_success(&mut self, m: &EngineMetrics) {
        let name = "vllm:request_success";
        self.header(name, "Count of successfully processed requests.", "counter");
        // Every reason is written, zero or not, as vLLM pre-creates them.
        for reason in [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::Abort,
        ] {
            let _ = writeln!(
                self.text,
                "{name}_total{{engine=\"0\",finished_reason=\"{}\",model_name=\"{}\"}} {}",
                reason.as_str(),
                self.model,
                float(m.request_success.get(reason) as f64)
            );
        }
        // vLLM 0.32 pre-creates two reasons the mock's engine never ends a request with.
        for reason in ["error", "repetition"] {
            let _ = writeln!(
                self.text,
                "{name}_total{{engine=\"0\",finished_reason=\"{reason}\",model_name=\"{}\"}} 0.0",
                self.model
            );
        }
    }

    fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        self.header(name, help, "histogram");
        let cumulative = histogram.cumulative();
        let bounds = histogram
            .bounds
            .iter()
            .map(|bound| float(*bound))
            .chain(std::iter::once(String::from("+Inf")));
        for (le, count) in bounds.zip(cumulative) {
            let _ = writeln!(
                self.text,
                "{name}_bucket{{engine=\"0\",le=\"{le}\",model_name=\"{}\"}} {}",
                self.model,
                float(count as f64)
            );
        }
        let _ = writeln!(
            self.text,
            "{name}_count{{engine=\"0\",model_name=\"{}\"}} {}",
            self.model,
            float(histogram.count as f64)
        );
        let _ = writeln!(
            self.text,
            "{name}_sum{{engine=\"0\",model_name=\"{}\"}} {}",
            self.model,
            float(histogram.sum)
        );
    }

    fn cache_config_info(&mut self, snapshot: &MetricsSnapshot) {
        let name = "vllm:cache_config_info";
        self.header(name, "Information of the LLMEngine CacheConfig", "gauge");
        // CacheConfig fields a router reads (GIE reads block_size and num_gpu_blocks), in
        // sorted order; no model_name label, as in vLLM.
        let _ = writeln!(
            self.text,
            "{name}{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256\"}} 1.0",
            snapshot.block_size, snapshot.num_gpu_blocks
        );
    }
}

/// Prometheus float text, Python-style: integral values keep a `.0`.
fn float(value: f64) -> String {
    if value.is_nan() {
        String::from("NaN")
    } else if value.is_infinite() {
        String::from(if value > 0.0 { "+Inf" } else { "-Inf" })
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

/// Label-value escaping of the text format: backslash, double quote and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> MetricsSnapshot {
        let mut metrics = EngineMetrics {
            prefix_cache_queries: 5040,
            prefix_cache_hits: 4704,
            ..EngineMetrics::default()
        };
        metrics.request_success.length = 2;
        metrics.ttft.observe(0.29);
        metrics.ttft.observe(3.0);
        MetricsSnapshot {
            running: 3,
            waiting: 1,
            kv_usage: 0.25,
            block_size: 16,
            num_gpu_blocks: 8750,
            metrics,
        }
    }

    #[test]
    fn writes_vllm_names_labels_and_types() {
        let text = render(&snapshot(), "m\"x");
        for line in [
            "# TYPE vllm:num_requests_running gauge",
            "vllm:num_requests_running{engine=\"0\",model_name=\"m\\\"x\"} 3.0",
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\\\"x\"} 1.0",
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\\\"x\"} 0.25",
            "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\\\"x\"} 0.25",
            "# TYPE vllm:prefix_cache_queries counter",
            "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\\\"x\"} 5040.0",
            "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\\\"x\"} 4704.0",
            "vllm:num_preemptions_total{engine=\"0\",model_name=\"m\\\"x\"} 0.0",
            "vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"m\\\"x\"} 0.0",
            "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"m\\\"x\"} 2.0",
            "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"m\\\"x\"} 0.0",
            "vllm:request_success_total{engine=\"0\",finished_reason=\"error\",model_name=\"m\\\"x\"} 0.0",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.25\",model_name=\"m\\\"x\"} 0.0",
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.5\",model_name=\"m\\\"x\"} 1.0",
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"2560.0\",model_name=\"m\\\"x\"} 2.0",
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\\\"x\"} 2.0",
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\\\"x\"} 2.0",
            "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"m\\\"x\"} 3.29",
            "# TYPE vllm:inter_token_latency_seconds histogram",
            "# TYPE vllm:e2e_request_latency_seconds histogram",
            "# TYPE vllm:request_queue_time_seconds histogram",
            "vllm:request_queue_time_seconds_bucket{engine=\"0\",le=\"7680.0\",model_name=\"m\\\"x\"} 0.0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(text.contains("vllm:cache_config_info{block_size=\"16\","));
        assert!(text.contains("num_gpu_blocks=\"8750\""));
    }

    #[test]
    fn every_sample_line_is_name_labels_value() {
        let text = render(&snapshot(), "m");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(series.starts_with("vllm:"), "{line}");
            assert!(series.ends_with('}'), "{line}");
            value.parse::<f64>().unwrap();
        }
    }

    #[test]
    fn floats_keep_python_spelling() {
        assert_eq!(float(1.0), "1.0");
        assert_eq!(float(0.001), "0.001");
        assert_eq!(float(f64::INFINITY), "+Inf");
    }
}
