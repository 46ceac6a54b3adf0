//! Traces from a Python process: with `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces
//! one) set, the SDK's calls are exported as spans (`shardcache.ask`: the member asked,
//! a hedge or not), each the parent of the spoke's span of the request and of everything
//! the spoke asked of its group and hub (`shardcache_transport::telemetry`).
//!
//! Started with the process's runtime (`process.rs`), and again in a forked
//! DataLoader worker: the exporter's thread stays in the parent, so the child makes an
//! exporter of its own and the process's one layer (a subscriber is set once) takes its
//! tracer from then on ([`ProcessTracer`]). A process that exits normally flushes what it
//! holds (`flush_traces`, which the package calls at exit); a worker ended by `os._exit`
//! sends what its batches held up to the last `OTEL_BSP_SCHEDULE_DELAY` (5 s by default).

use std::sync::{Arc, OnceLock, RwLock};

use opentelemetry::{
    Context,
    trace::{SpanBuilder, Tracer},
};
use opentelemetry_sdk::trace::SdkTracer;
use shardcache_transport::telemetry::{self, Telemetry};
use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};

/// The tracer of the process this is: the layer keeps this one, a forked child swaps
/// what is inside.
#[derive(Debug, Clone)]
struct ProcessTracer(Arc<RwLock<SdkTracer>>);

impl Tracer for ProcessTracer {
    type Span = opentelemetry_sdk::trace::Span;

    fn build_with_context(&self, builder: SpanBuilder, parent_cx: &Context) -> Self::Span {
        self.0.read().unwrap_or_else(|p| p.into_inner()).build_with_context(builder, parent_cx)
    }
}

/// The tracer the process's layer uses; `None` when another subscriber was already set
/// (the program's own: it exports as it likes).
static TRACER: OnceLock<Option<ProcessTracer>> = OnceLock::new();

/// A new process's export when the environment asks for one (`process::runtime` calls
/// it once a process, within its new `runtime`: the exporter's channel lives on it), its
/// tracer then the one the process's layer uses.
pub fn start(runtime: &tokio::runtime::Runtime) -> Option<Telemetry> {
    let _entered = runtime.enter();
    let export = Telemetry::from_env("shardcache-python").ok()??;
    let installed = TRACER.get_or_init(|| {
        let tracer = ProcessTracer(Arc::new(RwLock::new(export.tracer())));
        let subscriber = tracing_subscriber::registry()
            .with(telemetry::span_layer(tracer.clone()))
            .with(tracing_subscriber::filter::LevelFilter::INFO);
        subscriber.try_init().ok().map(|()| tracer)
    });
    if let Some(tracer) = installed {
        *tracer.0.write().unwrap_or_else(|p| p.into_inner()) = export.tracer();
    }
    Some(export)
}
