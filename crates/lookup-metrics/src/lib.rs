//! Metrics plumbing shared by the lookup client (`lookup-tokio`) and the reference
//! server (`lookup-server`), so that neither crate depends on the other for it:
//!
//! - [`LATENCY_BUCKETS_SECONDS`]: the histogram buckets every latency metric of both
//!   is exported with;
//! - with the `prometheus` feature, `install_prometheus`: a Prometheus recorder as
//!   the process's one global `metrics` recorder, served over HTTP from a thread of its
//!   own.
//!
//! The metrics themselves (names, labels, descriptions) belong to the crate that
//! records them: `lookup_tokio::metrics` and `lookup_server::metrics`.
#![forbid(unsafe_code)]

/// Upper bounds (seconds) of the histogram buckets that `install_prometheus` (feature
/// `prometheus`) exports: from 50 µs (a lookup answered from a local index) to 10 s
/// (beyond the default `lookup_timeout_s` of 5 s).
pub const LATENCY_BUCKETS_SECONDS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

#[cfg(feature = "prometheus")]
pub use prometheus::{MetricsError, PrometheusHandle, install_prometheus};

#[cfg(feature = "prometheus")]
mod prometheus {
    use std::net::SocketAddr;

    pub use metrics_exporter_prometheus::PrometheusHandle;
    use metrics_exporter_prometheus::{BuildError, ExporterFuture, PrometheusBuilder};

    use super::LATENCY_BUCKETS_SECONDS;

    /// Why [`install_prometheus`] failed.
    #[derive(Debug, thiserror::Error)]
    #[non_exhaustive]
    pub enum MetricsError {
        /// The exporter could not be built: the address is in use or not allowed
        /// (I/O), or another recorder is installed already (caller misuse: one
        /// recorder per process).
        #[error("prometheus exporter: {0}")]
        Exporter(#[from] BuildError),
        /// I/O: the exporter's thread or runtime could not be started.
        #[error("prometheus exporter thread: {0}")]
        Thread(#[from] std::io::Error),
    }

    /// Installs a Prometheus recorder as the process's global [`metrics`] recorder and
    /// serves its text exposition at `http://{addr}/metrics` (any path answers),
    /// histograms with [`LATENCY_BUCKETS_SECONDS`]. Call it before connecting clients
    /// or binding servers: they take their handles from the recorder of that moment.
    /// It registers no descriptions: `lookup_tokio::metrics::install_prometheus` and
    /// `lookup_server::metrics::install_prometheus` call this and then their crate's
    /// `describe`.
    ///
    /// The listener runs on a thread of its own with its own runtime, so scrapes are
    /// answered while the caller's runtime is busy or blocked; this call waits only
    /// for the bind. Every address is accepted: the exposition holds counts and
    /// timings, no keys or prompts. Returns a handle that renders the same text
    /// in-process.
    ///
    /// # Errors
    /// [`MetricsError::Exporter`] when `addr` cannot be bound or a recorder is already
    /// installed (a process has one); [`MetricsError::Thread`] when the thread or its
    /// runtime cannot be started.
    pub fn install_prometheus(addr: SocketAddr) -> Result<PrometheusHandle, MetricsError> {
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("lookup-metrics".to_owned())
            .spawn(move || match start(addr) {
                Ok((handle, exporter, runtime)) => {
                    let _ = ready.send(Ok(handle));
                    if let Err(error) = runtime.block_on(exporter) {
                        tracing::error!(?error, "prometheus exporter stopped");
                    }
                }
                // The runtime is dropped here, on this thread, never in the caller's
                // async context.
                Err(error) => {
                    let _ = ready.send(Err(error));
                }
            })?;
        let handle = started.recv().map_err(|_| {
            MetricsError::Thread(std::io::Error::other("the exporter thread ended early"))
        })??;
        tracing::info!(%addr, "prometheus metrics served over http");
        Ok(handle)
    }

    /// On the exporter's thread: its runtime, the bound listener, the global recorder.
    fn start(
        addr: SocketAddr,
    ) -> Result<(PrometheusHandle, ExporterFuture, tokio::runtime::Runtime), MetricsError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (recorder, exporter) = {
            // The listener and the upkeep task register with this runtime.
            let _entered = runtime.enter();
            PrometheusBuilder::new()
                .with_http_listener(addr)
                .set_buckets(&LATENCY_BUCKETS_SECONDS)?
                .build()?
        };
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).map_err(BuildError::from)?;
        Ok((handle, exporter, runtime))
    }
}
