//! [`ClientBuilder`]: a [`LookupClient`] from its settings in one expression; errors
//! are kept until [`ClientBuilder::build`] or `connect` reports the first.

use std::time::Duration;

use lookup_core::{Config, OnPreemption};
use serde_json::Value;
use tokio::runtime::Handle;

use super::extra_config::KvConnectorExtraConfig;
use super::{ClientConfig, LookupClient};
use crate::{DirectConfig, Endpoint, Error, KeyLayout, Transport, ZmqConfig};

/// Builds a [`ClientConfig`] and connects a [`LookupClient`]
/// ([`LookupClient::builder`]):
///
/// ```no_run
/// # async fn f() -> Result<(), lookup_tokio::Error> {
/// use std::time::Duration;
/// let client = lookup_tokio::LookupClient::builder()
///     .zmq("tcp://127.0.0.1:5555")
///     .block_size(16)
///     .lookup_async(true)
///     .lookup_prefetch_limit(32)
///     .lookup_timeout(Duration::from_secs(2))
///     .connect_lazy()?;
/// # drop(client); Ok(()) }
/// ```
///
/// Required: a transport ([`zmq`](Self::zmq), [`zmq_endpoint`](Self::zmq_endpoint),
/// [`direct`](Self::direct) or [`transport`](Self::transport)). The block size
/// defaults to vLLM's 16 tokens. Every other setting has `spec/behaviour.md`'s
/// default. A setting that does not parse is kept as an error: the first one is
/// returned by [`build`](Self::build) / [`connect`](Self::connect) /
/// [`connect_lazy`](Self::connect_lazy). [`connect`](Self::connect) is strict (it
/// fails when the server does not answer within
/// [`connect_timeout`](Self::connect_timeout)); [`connect_lazy`](Self::connect_lazy)
/// returns at once, as a scheduler that starts before its store wants.
#[derive(Debug)]
#[must_use]
pub struct ClientBuilder {
    core: Config,
    transport: Option<Transport>,
    event_capacity: Option<usize>,
    wait_margin: Option<Duration>,
    probe_budget: Option<Duration>,
    client_label: Option<String>,
    connect_timeout: Option<Duration>,
    /// The store-key settings of the extra config given (key, value), checked
    /// against a direct transport's layout by [`build`](Self::build).
    store_key_settings: Vec<(String, Value)>,
    error: Option<Error>,
}

/// `kv_connector_extra_config` keys that change the store keys (vLLM 0.33's
/// `worker.py`).
const STORE_KEY_SETTINGS: [&str; 5] = [
    "cache_prefix",
    "store_tp_size",
    "enable_store_tp_lcm",
    "prefill_tp_sizes",
    "enable_cross_layers_blocks",
];

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            core: Config::new(16),
            transport: None,
            event_capacity: None,
            wait_margin: None,
            probe_budget: None,
            client_label: None,
            store_key_settings: Vec::new(),
            connect_timeout: None,
            error: None,
        }
    }
}

impl ClientBuilder {
    fn fail(mut self, error: Error) -> Self {
        self.error.get_or_insert(error);
        self
    }

    /// A lookup server over ZeroMQ at `endpoint` (`tcp://HOST:PORT` or
    /// `ipc://PATH`), with [`ZmqConfig::new`]'s defaults.
    pub fn zmq(self, endpoint: &str) -> Self {
        match endpoint.parse::<Endpoint>() {
            Ok(endpoint) => self.zmq_endpoint(endpoint),
            Err(e) => self.fail(Error::InvalidClientConfig {
                key: "endpoint",
                why: e.to_string(),
            }),
        }
    }

    /// A lookup server over ZeroMQ at `endpoint` (for example
    /// [`Endpoint::vllm`], a vLLM worker's ipc path).
    pub fn zmq_endpoint(self, endpoint: Endpoint) -> Self {
        self.transport(ZmqConfig::new(endpoint))
    }

    /// The Mooncake master at `master` (`host:port` or `etcd://h1:p1;h2:p2`) asked
    /// directly, keys laid out by `layout` ([`DirectConfig::parse`]; an address that
    /// does not parse, such as `"not-a-host"`, is the error `build` returns).
    pub fn direct(self, master: &str, layout: KeyLayout) -> Self {
        match DirectConfig::parse(master, layout) {
            Ok(direct) => self.transport(direct),
            Err(e) => self.fail(e),
        }
    }

    /// Any transport with its settings ([`ZmqConfig`], [`DirectConfig`]).
    pub fn transport(mut self, transport: impl Into<Transport>) -> Self {
        self.transport = Some(transport.into());
        self
    }

    /// Lookup alignment in tokens (vLLM's `--block-size`; default 16).
    pub fn block_size(mut self, block_size: u32) -> Self {
        self.core.block_size = block_size;
        self
    }

    /// The lookup keys of vLLM's `kv_connector_extra_config`
    /// ([`KvConnectorExtraConfig::from_kv_connector_extra_config`]: an unknown or
    /// mistyped key is the error `build` returns). Settings made after this call
    /// override it.
    ///
    /// The keys that change the store keys (`cache_prefix`, `store_tp_size`,
    /// `enable_store_tp_lcm`, `prefill_tp_sizes`, `enable_cross_layers_blocks`) are
    /// the worker's with [`zmq`](Self::zmq); with [`direct`](Self::direct) the
    /// client builds the keys itself, so `build` refuses one its `KeyLayout` does not
    /// carry (a silent miss otherwise): build that client from
    /// [`VllmSetup`](crate::vllm::VllmSetup), which honours them all.
    pub fn kv_connector_extra_config(mut self, extra: &Value) -> Self {
        self.note_store_keys(extra);
        self.extra(KvConnectorExtraConfig::from_kv_connector_extra_config(
            extra,
        ))
    }

    /// As [`kv_connector_extra_config`](Self::kv_connector_extra_config), ignoring
    /// unknown keys.
    pub fn kv_connector_extra_config_lenient(mut self, extra: &Value) -> Self {
        self.note_store_keys(extra);
        self.extra(KvConnectorExtraConfig::from_kv_connector_extra_config_lenient(extra))
    }

    fn note_store_keys(&mut self, extra: &Value) {
        if let Some(map) = extra.as_object() {
            for key in STORE_KEY_SETTINGS {
                if let Some(value) = map.get(key).filter(|v| !v.is_null()) {
                    self.store_key_settings
                        .push((key.to_owned(), value.clone()));
                }
            }
        }
    }

    fn extra(mut self, read: Result<KvConnectorExtraConfig, Error>) -> Self {
        match read {
            Ok(keys) => {
                keys.apply(&mut self.core);
                self
            }
            Err(e) => self.fail(e),
        }
    }

    /// `enable_lookup` (default true).
    pub fn enable_lookup(mut self, on: bool) -> Self {
        self.core.enable_lookup = on;
        self
    }

    /// `lookup_async`, the one switch between sync mode (false, vLLM's default:
    /// [`LookupClient::step_deadline`] is [`Deadline::Answer`](crate::Deadline::Answer)) and async mode (true).
    pub fn lookup_async(mut self, on: bool) -> Self {
        self.core.lookup_async = on;
        self
    }

    /// `load_async` (default true).
    pub fn load_async(mut self, on: bool) -> Self {
        self.core.load_async = on;
        self
    }

    /// `lookup_prefetch_limit`: most arrival-time lookups in flight (default 0, no
    /// prefetch; prefetch needs `lookup_async`).
    pub fn lookup_prefetch_limit(mut self, limit: u32) -> Self {
        self.core.lookup_prefetch_limit = limit;
        self
    }

    /// `lookup_prefetch_ttl_s` (default 2 s).
    pub fn lookup_prefetch_ttl(mut self, ttl: Duration) -> Self {
        self.core.lookup_prefetch_ttl = ttl;
        self
    }

    /// `lookup_timeout_s` (default 5 s).
    pub fn lookup_timeout(mut self, timeout: Duration) -> Self {
        self.core.lookup_timeout = timeout;
        self
    }

    /// `max_pending_age_s`: how long a lookup may wait for the wire before it ends
    /// unsent as unavailable (default 5 s; must be positive).
    pub fn max_pending_age(mut self, age: Duration) -> Self {
        self.core.max_pending_age = age;
        self
    }

    /// Most lookup RPCs on the wire at once (default 1).
    pub fn max_in_flight(mut self, n: u32) -> Self {
        self.core.max_in_flight = n;
        self
    }

    /// `lookup_priority`: lookups a probe waits for go before queued prefetches
    /// (default true; rule 15).
    pub fn lookup_priority(mut self, on: bool) -> Self {
        self.core.lookup_priority = on;
        self
    }

    /// `lookup_share`: identical lookups in flight share one RPC (default true;
    /// rule 16).
    pub fn lookup_share(mut self, on: bool) -> Self {
        self.core.lookup_share = on;
        self
    }

    /// `max_queued`: RPCs waiting for the wire before new prefetches are refused
    /// (default 65,536; at least 1).
    pub fn max_queued(mut self, n: u32) -> Self {
        self.core.max_queued = n;
        self
    }

    /// `lookup_on_preemption`: what a preemption does to the request's lookup
    /// (default `keep_wait`; rule 8).
    pub fn lookup_on_preemption(mut self, policy: OnPreemption) -> Self {
        self.core.lookup_on_preemption = policy;
        self
    }

    /// `lookup_preempted_wait_s`: how long a preempted request's probe waits with
    /// `wait` or `keep_wait` (default 5 s; rule 8).
    pub fn lookup_preempted_wait(mut self, wait: Duration) -> Self {
        self.core.lookup_preempted_wait = wait;
        self
    }

    /// The whole lifecycle configuration at once (its `block_size` included).
    pub fn core(mut self, core: Config) -> Self {
        self.core = core;
        self
    }

    /// [`ClientConfig::event_capacity`] (default 1,024).
    pub fn event_capacity(mut self, events: usize) -> Self {
        self.event_capacity = Some(events);
        self
    }

    /// [`ClientConfig::wait_margin`] (default 100 ms).
    pub fn wait_margin(mut self, margin: Duration) -> Self {
        self.wait_margin = Some(margin);
        self
    }

    /// [`ClientConfig::probe_budget`] (default zero).
    pub fn probe_budget(mut self, budget: Duration) -> Self {
        self.probe_budget = Some(budget);
        self
    }

    /// [`ClientConfig::client_label`]: the `client` label of every metric series
    /// (default: where lookups go).
    pub fn client_label(mut self, label: impl Into<String>) -> Self {
        self.client_label = Some(label.into());
        self
    }

    /// The configuration, checked.
    ///
    /// # Errors
    /// The first setting that did not parse ([`Error::InvalidClientConfig`],
    /// [`Error::ExtraConfig`]); [`Error::InvalidClientConfig`] with key `transport`
    /// when none was given; [`Error::Core`] for an invalid lifecycle configuration
    /// ([`Config::validate`]); a direct transport setting the master client would
    /// refuse ([`DirectConfig::validate`]).
    pub fn build(self) -> Result<ClientConfig, Error> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let transport = self.transport.ok_or(Error::InvalidClientConfig {
            key: "transport",
            why: "no transport: call zmq, direct or transport".to_owned(),
        })?;
        self.core.validate()?;
        if let Transport::Direct(direct) = &transport {
            direct.validate()?;
            for (key, value) in &self.store_key_settings {
                let carried = match (key.as_str(), value) {
                    ("cache_prefix", Value::String(prefix)) => {
                        direct.layout.cache_prefix().unwrap_or_default() == prefix
                    }
                    ("enable_cross_layers_blocks" | "enable_store_tp_lcm", Value::Bool(false)) => {
                        true
                    }
                    _ => false,
                };
                if !carried {
                    return Err(Error::ExtraConfig {
                        key: key.clone(),
                        why: format!(
                            "{value} changes the store keys, and the direct transport's \
                             KeyLayout does not carry it (a silent miss): build the client \
                             with lookup_tokio::vllm::VllmSetup::direct_client_config"
                        ),
                    });
                }
            }
        }
        let mut config = ClientConfig::new(transport, self.core.block_size);
        config.core = self.core;
        if let Some(events) = self.event_capacity {
            config.event_capacity = events;
        }
        if let Some(margin) = self.wait_margin {
            config.wait_margin = margin;
        }
        if let Some(budget) = self.probe_budget {
            config.probe_budget = budget;
        }
        config.client_label = self.client_label;
        if let Some(bound) = self.connect_timeout {
            config.connect_timeout = bound;
        }
        Ok(config)
    }

    /// [`ClientConfig::connect_timeout`] (default 1 s): how long the strict
    /// [`connect`](Self::connect) waits for the server to answer.
    pub fn connect_timeout(mut self, bound: Duration) -> Self {
        self.connect_timeout = Some(bound);
        self
    }

    /// [`build`](Self::build), then the strict [`LookupClient::connect`] on the current
    /// tokio runtime: fails with the reason when the server does not answer within
    /// [`connect_timeout`](Self::connect_timeout).
    ///
    /// # Errors
    /// As [`build`](Self::build) and [`LookupClient::connect`].
    pub async fn connect(self) -> Result<LookupClient, Error> {
        LookupClient::connect(self.build()?).await
    }

    /// [`build`](Self::build), then [`LookupClient::connect_lazy`] on the current tokio
    /// runtime: returns at once; a server that is not up yet is not an error.
    ///
    /// # Errors
    /// As [`build`](Self::build) and [`LookupClient::connect_lazy`].
    pub fn connect_lazy(self) -> Result<LookupClient, Error> {
        LookupClient::connect_lazy(self.build()?)
    }

    /// [`build`](Self::build), then the strict [`LookupClient::connect_with_handle`]:
    /// for a thread-based scheduler, the I/O task runs on `runtime`.
    ///
    /// # Errors
    /// As [`build`](Self::build) and [`LookupClient::connect_with_handle`].
    pub fn connect_with_handle(self, runtime: &Handle) -> Result<LookupClient, Error> {
        LookupClient::connect_with_handle(self.build()?, runtime)
    }

    /// [`build`](Self::build), then [`LookupClient::connect_lazy_with_handle`]: for a
    /// thread-based scheduler, the I/O task runs on `runtime`; returns at once.
    ///
    /// # Errors
    /// As [`build`](Self::build) and [`LookupClient::connect_lazy_with_handle`].
    pub fn connect_lazy_with_handle(self, runtime: &Handle) -> Result<LookupClient, Error> {
        LookupClient::connect_lazy_with_handle(self.build()?, runtime)
    }
}
