//! Distributed traces with OpenTelemetry: a trainer's call through the SDK, the spoke, a
//! group member and the hub is one trace, each hop a span naming what it waited on.
//!
//! - **On only when asked**: the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` (an OTLP/gRPC collector, e.g. `http://otel:4317`)
//!   turns export on ([`Telemetry::from_env`]); without either nothing is exported and
//!   nothing is sent to a collector. `OTEL_SERVICE_NAME` overrides the service name;
//!   `OTEL_TRACES_SAMPLER`/`OTEL_TRACES_SAMPLER_ARG` the sampler (default: the caller's
//!   decision when the call carries one, else always on).
//! - **W3C trace context in the gRPC metadata**: every call of the SDK, the spoke's to
//!   its hubs and peers included (they all pass `shardcache_client::Credentials`), carries
//!   `traceparent` ([`inject`]); both servers start each request's span as its child
//!   ([`set_parent`], in `shardcache_serving::server`).
//! - **Which traces are kept** is decided in the collector (tail sampling), so that a
//!   kept trace is whole: every process exports every span of a sampled trace, and the
//!   spoke marks a read slower than its job's p99 so far `shardcache.slow = true`;
//!   `deploy/otel/collector.yaml` keeps those, errors, and a share of the rest. A head
//!   decision in the SDK cannot do it: when a call starts nobody knows it will be slow.
//!
//! Spans are `tracing` spans (`tracing-opentelemetry` turns them into OpenTelemetry's):
//! the code names its waits with `tracing::info_span!` and records their fields, and the
//! same spans give the log lines their context.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use opentelemetry::{
    global,
    propagation::{Extractor, Injector},
    trace::TracerProvider as _,
};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{Layer, registry::LookupSpan};

/// Set once a process exports traces: calls carry their context only then.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The environment variables that turn export on, the signal's own first.
pub const ENDPOINT_VARIABLES: [&str; 2] =
    ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];

/// A process's trace export: spans batched to the collector on a thread of the SDK's
/// own; flushed when dropped (at a server's graceful stop, a command's end).
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

/// Why export could not start (a collector's address that is not a URL).
#[derive(Debug, thiserror::Error)]
#[error("OpenTelemetry export to {endpoint}: {cause}")]
pub struct TelemetryError {
    endpoint: String,
    cause: String,
}

impl Telemetry {
    /// Export as the environment asks: `None` when no endpoint variable is set. Must run
    /// within a tokio runtime (the OTLP exporter's channel lives on it).
    pub fn from_env(service: &str) -> Result<Option<Self>, TelemetryError> {
        let Some(endpoint) =
            ENDPOINT_VARIABLES.iter().find_map(|v| std::env::var(v).ok().filter(|e| !e.is_empty()))
        else {
            return Ok(None);
        };
        Self::start(service, &endpoint).map(Some)
    }

    /// Export to the OTLP/gRPC collector at `endpoint` as `service` (unless
    /// `OTEL_SERVICE_NAME` names it).
    pub fn start(service: &str, endpoint: &str) -> Result<Self, TelemetryError> {
        use opentelemetry_otlp::WithExportConfig as _;
        let failed = |cause: String| TelemetryError { endpoint: endpoint.to_owned(), cause };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let name = std::env::var("OTEL_SERVICE_NAME").ok().filter(|n| !n.is_empty());
        let resource =
            Resource::builder().with_service_name(name.unwrap_or_else(|| service.to_owned())).build();
        let provider =
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        global::set_text_map_propagator(TraceContextPropagator::new());
        EXPORTING.store(true, Relaxed);
        Ok(Self { provider })
    }

    /// The `tracing` layer that turns this process's spans at info and above into
    /// exported ones, whatever `RUST_LOG` says of the logs (the HTTP/2 stack's spans, at
    /// trace and debug, stay out of the traces).
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        self.every_span().with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    }

    /// [`Telemetry::layer`] without its filter, for a subscriber that filters every layer
    /// alike.
    pub fn every_span<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        span_layer(self.tracer())
    }

    /// This export's tracer (what a process that forks swaps in its child).
    pub fn tracer(&self) -> opentelemetry_sdk::trace::SdkTracer {
        self.provider.tracer("shardcache")
    }

    /// Sends what is buffered now (a test, before it reads the collector's file).
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(error = %e, "could not flush traces to the collector");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "traces not flushed at exit");
        }
    }
}

/// The `tracing` layer that makes `tracer`'s spans of the process's `tracing` spans, with
/// no filter of its own.
pub fn span_layer<S, T>(tracer: T) -> tracing_opentelemetry::OpenTelemetryLayer<S, T>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    T: opentelemetry::trace::Tracer + 'static,
    T::Span: Send + Sync,
{
    // Each span carries its own fields only: no source location, thread, target or
    // busy/idle times (a clock read at every poll of an instrumented future), which cost
    // the warm reads CPU for nothing a slow read's trace needs (BENCHMARKS.md,
    // observe-cost-bench).
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
}

/// Whether this process exports traces (then its calls carry their context).
pub fn exporting() -> bool {
    EXPORTING.load(Relaxed)
}

/// `make()`'s span when this process exports traces, else a disabled one: the spans that
/// exist for traces only cost nothing (and add nothing to log lines) when export is off.
pub fn traced(make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if exporting() { make() } else { tracing::Span::none() }
}

/// Adds the current span's W3C trace context (`traceparent`, `tracestate`) to an
/// outgoing call's metadata; nothing outside a span, or without a global propagator.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    // A program that exports its own spans (its own `tracing-opentelemetry` layer and
    // global propagator) has its calls carry them too.
    let context = span.context();
    global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut MetadataCarrier(metadata))
    });
}

/// Makes `span` (a request's) the child of the caller's span its `headers` name, when
/// they name one and this process exports traces.
pub fn set_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    if !exporting() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = global::get_text_map_propagator(|propagator| propagator.extract(&HeaderCarrier(headers)));
    // Fails only when the span is not OpenTelemetry's (filtered out): then it has none.
    let _ = span.set_parent(parent);
}

/// Sets an attribute on `span`'s exported span (a number or a word the span did not
/// declare as a `tracing` field, e.g. one known only at its end).
pub fn attribute(span: &tracing::Span, key: &'static str, value: impl Into<opentelemetry::Value>) {
    if exporting() {
        span.set_attribute(key, value);
    }
}

struct MetadataCarrier<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataCarrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct HeaderCarrier<'a>(&'a http::HeaderMap);

impl Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_injected_into_metadata_is_extracted_from_its_headers() {
        let propagator = TraceContextPropagator::new();
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", traceparent.parse().unwrap_or_else(|_| unreachable!()));
        let context =
            opentelemetry::propagation::TextMapPropagator::extract(&propagator, &HeaderCarrier(&headers));
        let mut metadata = tonic::metadata::MetadataMap::new();
        opentelemetry::propagation::TextMapPropagator::inject_context(
            &propagator,
            &context,
            &mut MetadataCarrier(&mut metadata),
        );
        assert_eq!(metadata.get("traceparent").and_then(|v| v.to_str().ok()), Some(traceparent));
    }
}
