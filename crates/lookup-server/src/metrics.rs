//! Metrics of the lookup server, through the [`metrics`] facade.
//!
//! Nothing is recorded unless the process installs a recorder
//! ([`metrics::set_global_recorder`], or `install_prometheus` with the `prometheus`
//! feature). Each [`LookupServer`](crate::LookupServer) takes its metric handles from
//! the recorder installed when it binds, so **install the recorder first**; without
//! one every handle is a no-op and recording costs a branch. Handles are registered
//! once per server: a recording is one atomic operation on an existing series.
//!
//! | name | type | unit | labels | what |
//! |---|---|---|---|---|
//! | `lookup_server_requests_total` | counter | requests | `format`, `kind` | messages received: `kind` `lookup`, `reset`, `malformed`, `unknown`, `no_delimiter`; `format` `tagged-blob`, `msgpack-hex`, `unknown` (neither), `none` (no delimiter) |
//! | `lookup_server_keys_checked_total` | counter | keys | — | store keys the index asked about (an early stop asks fewer than blocks × rank namespaces) |
//! | `lookup_server_index_latency_seconds` | histogram | seconds | — | per index call, failed ones included |
//! | `lookup_server_decode_errors_total` | counter | requests | `format` | malformed lookups, answered with hit 0 (`spec/wire.md`) |
//! | `lookup_server_mooncake_leader_changes_total` | counter | changes | — | moves of a [`MooncakeIndex`](crate::MooncakeIndex) on an `etcd://` address to a newer Mooncake master leader (`spec/mooncake-master-rpc.md`, "High availability") |
//! | `lookup_server_mooncake_lease_seconds` | gauge | seconds | — | the read lease a [`MooncakeIndex`](crate::MooncakeIndex) goes by: the configured one, then the master's own from its first hit (`spec/mooncake-master-rpc.md`, "Where the lease can be read"); clients' `lookup_prefetch_ttl_s` must stay below it |
//!
//!
//! The client's metrics (`lookup_*` without `server`) are `lookup_tokio::metrics`';
//! a process with both installs one recorder and calls both crates' `describe`.

use std::time::Duration;

use lookup_core::wire::{Format, ServerRequest};
use metrics::{Counter, Gauge, Histogram, Unit};

pub use lookup_metrics::LATENCY_BUCKETS_SECONDS;
#[cfg(feature = "prometheus")]
pub use lookup_metrics::{MetricsError, PrometheusHandle};

/// Registers the description and unit of every metric of the module's table with the
/// installed recorder (exporters print them as `# HELP`). `install_prometheus`
/// calls it; call it after installing another recorder. Harmless without one, or
/// twice.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "lookup_server_requests_total",
        Unit::Count,
        "Messages received by the lookup server, by format and kind"
    );
    describe_counter!(
        "lookup_server_keys_checked_total",
        Unit::Count,
        "Store keys asked about by the lookup server"
    );
    describe_histogram!(
        "lookup_server_index_latency_seconds",
        Unit::Seconds,
        "Index calls of the lookup server"
    );
    describe_counter!(
        "lookup_server_decode_errors_total",
        Unit::Count,
        "Malformed lookups received by the lookup server, by format"
    );
    describe_counter!(
        "lookup_server_mooncake_leader_changes_total",
        Unit::Count,
        "Moves of the Mooncake index to a newer master leader (HA through etcd)"
    );
    describe_gauge!(
        "lookup_server_mooncake_lease_seconds",
        Unit::Seconds,
        "The Mooncake master's read lease the index goes by (reported by the master once read)"
    );
}

/// The handle of `lookup_server_mooncake_lease_seconds`, from the recorder installed
/// now (a no-op without one).
pub(crate) fn mooncake_lease() -> Gauge {
    metrics::gauge!("lookup_server_mooncake_lease_seconds")
}

/// The handle of `lookup_server_mooncake_leader_changes_total`, from the recorder
/// installed now (a no-op without one).
pub(crate) fn mooncake_leader_changes() -> Counter {
    metrics::counter!("lookup_server_mooncake_leader_changes_total")
}

/// Installs the Prometheus exporter ([`lookup_metrics::install_prometheus`]: the
/// process's global recorder, served at `http://{addr}/metrics` from a thread of its
/// own, histograms with [`LATENCY_BUCKETS_SECONDS`]), then [`describe`]s this crate's
/// metrics. Call it before binding servers.
///
/// # Errors
/// [`MetricsError::Exporter`] when `addr` cannot be bound or a recorder is already
/// installed (a process has one); [`MetricsError::Thread`] when the exporter's thread
/// or runtime cannot be started.
#[cfg(feature = "prometheus")]
pub fn install_prometheus(addr: std::net::SocketAddr) -> Result<PrometheusHandle, MetricsError> {
    let handle = lookup_metrics::install_prometheus(addr)?;
    describe();
    Ok(handle)
}

/// The metric handles of one [`LookupServer`](crate::LookupServer).
pub(crate) struct ServerMetrics {
    /// By [`ServerMetrics::request_index`].
    requests: [Counter; 7],
    keys_checked: Counter,
    index_latency: Histogram,
    /// `tagged-blob`, `msgpack-hex`.
    decode_errors: [Counter; 2],
}

impl ServerMetrics {
    /// Handles from the recorder installed now (no-ops without one).
    pub(crate) fn new() -> Self {
        use metrics::{counter, histogram};
        Self {
            requests: [
                counter!("lookup_server_requests_total", "format" => "tagged-blob", "kind" => "lookup"),
                counter!("lookup_server_requests_total", "format" => "msgpack-hex", "kind" => "lookup"),
                counter!("lookup_server_requests_total", "format" => "tagged-blob", "kind" => "reset"),
                counter!("lookup_server_requests_total", "format" => "tagged-blob", "kind" => "malformed"),
                counter!("lookup_server_requests_total", "format" => "msgpack-hex", "kind" => "malformed"),
                counter!("lookup_server_requests_total", "format" => "unknown", "kind" => "unknown"),
                counter!("lookup_server_requests_total", "format" => "none", "kind" => "no_delimiter"),
            ],
            keys_checked: counter!("lookup_server_keys_checked_total"),
            index_latency: histogram!("lookup_server_index_latency_seconds"),
            decode_errors: [
                counter!("lookup_server_decode_errors_total", "format" => "tagged-blob"),
                counter!("lookup_server_decode_errors_total", "format" => "msgpack-hex"),
            ],
        }
    }

    fn format_index(format: Format) -> usize {
        match format {
            Format::TaggedBlob => 0,
            Format::MsgpackHex => 1,
        }
    }

    /// A decoded request arrived.
    pub(crate) fn request(&self, request: &ServerRequest) {
        let i = match request {
            ServerRequest::Lookup { format, .. } => Self::format_index(*format),
            ServerRequest::Reset => 2,
            ServerRequest::Malformed { format, .. } => {
                self.decode_errors[Self::format_index(*format)].increment(1);
                3 + Self::format_index(*format)
            }
            ServerRequest::Unknown => 5,
        };
        self.requests[i].increment(1);
    }

    /// A message without the empty delimiter frame arrived (dropped).
    pub(crate) fn no_delimiter(&self) {
        self.requests[6].increment(1);
    }

    /// An index call asked about `keys` keys and took `took`.
    pub(crate) fn index_call(&self, keys: usize, took: Duration) {
        self.keys_checked
            .increment(u64::try_from(keys).unwrap_or(u64::MAX));
        self.index_latency.record(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use lookup_core::BlockHashes;
    use lookup_core::wire::WireError;
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

    use super::*;

    /// A recorder of its own (not the global one) and its rendering.
    fn recorder() -> PrometheusRecorder {
        PrometheusBuilder::new()
            .set_buckets(&LATENCY_BUCKETS_SECONDS)
            .expect("buckets")
            .build_recorder()
    }

    /// The value of the series `series` (name and labels as rendered), if present.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().expect("a number"))
        })
    }

    #[test]
    fn server_requests_by_format_and_kind() {
        let recorder = recorder();
        let handle = recorder.handle();
        let server = metrics::with_local_recorder(&recorder, ServerMetrics::new);
        let lookup = |format| ServerRequest::Lookup {
            format,
            num_tokens: 32,
            block_hashes: BlockHashes::from_u64s(&[1, 2]),
        };
        server.request(&lookup(Format::TaggedBlob));
        server.request(&lookup(Format::TaggedBlob));
        server.request(&lookup(Format::MsgpackHex));
        server.request(&ServerRequest::Reset);
        server.request(&ServerRequest::Malformed {
            format: Format::MsgpackHex,
            error: WireError::WrongFrameCount {
                expected: 2,
                got: 3,
            },
        });
        server.request(&ServerRequest::Unknown);
        server.no_delimiter();
        server.index_call(6, Duration::from_micros(200));
        server.index_call(2, Duration::from_millis(30));
        let text = handle.render();
        let get = |series: &str| value(&text, series);
        let req = |format: &str, kind: &str| {
            get(&format!(
                "lookup_server_requests_total{{format=\"{format}\",kind=\"{kind}\"}}"
            ))
        };
        assert_eq!(req("tagged-blob", "lookup"), Some(2.0));
        assert_eq!(req("msgpack-hex", "lookup"), Some(1.0));
        assert_eq!(req("tagged-blob", "reset"), Some(1.0));
        assert_eq!(req("tagged-blob", "malformed"), Some(0.0));
        assert_eq!(req("msgpack-hex", "malformed"), Some(1.0));
        assert_eq!(req("unknown", "unknown"), Some(1.0));
        assert_eq!(req("none", "no_delimiter"), Some(1.0));
        assert_eq!(
            get("lookup_server_decode_errors_total{format=\"msgpack-hex\"}"),
            Some(1.0)
        );
        assert_eq!(
            get("lookup_server_decode_errors_total{format=\"tagged-blob\"}"),
            Some(0.0)
        );
        assert_eq!(get("lookup_server_keys_checked_total"), Some(8.0));
        assert_eq!(get("lookup_server_index_latency_seconds_count"), Some(2.0));
        assert_eq!(
            get("lookup_server_index_latency_seconds_bucket{le=\"0.00025\"}"),
            Some(1.0)
        );
    }
}
