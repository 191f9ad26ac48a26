//! vLLM's `kv_connector_extra_config` read with vLLM's key names
//! ([`KvConnectorExtraConfig`]), float seconds into [`Duration`]s.

use std::time::Duration;

use lookup_core::Config;
use serde::Deserialize;
use serde_json::Value;

use crate::Error;

/// The lookup keys of vLLM's `kv_connector_extra_config` (`spec/behaviour.md`,
/// "Configuration"), with vLLM's names and defaults, read by
/// [`from_kv_connector_extra_config`](Self::from_kv_connector_extra_config) and put
/// into a [`Config`] by [`apply`](Self::apply).
///
/// The keys (vLLM 0.33's MooncakeStoreConnector `scheduler.py` reads `enable_lookup`,
/// `lookup_async`, `load_async`; `worker.py` reads `lookup_rpc_port`; the prefetch
/// keys are vLLM's follow-up to #45659; the rest are *ours*):
///
/// | key | type | default | field |
/// |---|---|---|---|
/// | `enable_lookup` | bool | true | [`Config::enable_lookup`] |
/// | `lookup_async` | bool | false | [`Config::lookup_async`] |
/// | `load_async` | bool | true | [`Config::load_async`] |
/// | `lookup_prefetch_limit` | integer >= 0 | 0 | [`Config::lookup_prefetch_limit`] |
/// | `lookup_prefetch_ttl_s` | seconds >= 0 | 2.0 | [`Config::lookup_prefetch_ttl`] |
/// | `lookup_timeout_s` (ours) | seconds > 0 | 5.0 | [`Config::lookup_timeout`] |
/// | `lookup_priority` (ours) | bool | true | [`Config::lookup_priority`] |
/// | `lookup_share` (ours) | bool | true | [`Config::lookup_share`] |
/// | `max_in_flight` (ours) | integer >= 1 | 1 | [`Config::max_in_flight`] |
/// | `max_queued` (ours) | integer >= 1 | 65,536 | [`Config::max_queued`] |
/// | `max_pending_age_s` (ours) | seconds > 0 | 5.0 | [`Config::max_pending_age`] |
/// | `lookup_on_preemption` (ours) | `discard`, `keep`, `wait`, `keep_wait` | the core's | [`Config::lookup_on_preemption`] (rule 8) |
/// | `lookup_preempted_wait_s` (ours) | seconds >= 0 | 5.0 | [`Config::lookup_preempted_wait`] |
/// | `lookup_rpc_port` | integer >= 0 | 0 | [`lookup_rpc_port`](Self::lookup_rpc_port): the name in the worker's ipc path ([`Endpoint::vllm`](crate::Endpoint::vllm)) |
///
/// vLLM 0.33's other connector keys ([`VLLM_STORE_KEYS`]: the store's, not the
/// lookup's) are accepted and ignored, so an engine's whole extra config can be
/// passed as it is.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct KvConnectorExtraConfig {
    /// `enable_lookup`.
    pub enable_lookup: bool,
    /// `lookup_async`: the one switch between sync and async mode.
    pub lookup_async: bool,
    /// `load_async`.
    pub load_async: bool,
    /// `lookup_prefetch_limit`.
    pub lookup_prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s`, float seconds.
    #[serde(rename = "lookup_prefetch_ttl_s", with = "seconds")]
    pub lookup_prefetch_ttl: Duration,
    /// `lookup_timeout_s`, float seconds, positive.
    #[serde(rename = "lookup_timeout_s", with = "positive_seconds")]
    pub lookup_timeout: Duration,
    /// `lookup_priority`.
    pub lookup_priority: bool,
    /// `lookup_share`.
    pub lookup_share: bool,
    /// `max_in_flight`.
    pub max_in_flight: u32,
    /// `max_queued`.
    pub max_queued: u32,
    /// `max_pending_age_s`, float seconds, positive.
    #[serde(rename = "max_pending_age_s", with = "positive_seconds")]
    pub max_pending_age: Duration,
    /// `lookup_on_preemption`: what a preemption does to the request's lookup
    /// (`spec/behaviour.md` rule 8).
    #[serde(with = "on_preemption")]
    pub lookup_on_preemption: lookup_core::OnPreemption,
    /// `lookup_preempted_wait_s`, float seconds: how long a probe of a preempted
    /// request waits for its answer with `wait` or `keep_wait`.
    #[serde(rename = "lookup_preempted_wait_s", with = "seconds")]
    pub lookup_preempted_wait: Duration,
    /// `lookup_rpc_port`: a name in the worker's ipc path, not a TCP port.
    pub lookup_rpc_port: u32,
}

/// vLLM 0.33's MooncakeStoreConnector keys that configure the store, not the lookup
/// (`connector.py`, `worker.py`, `rdma_utils.py`): accepted and ignored by
/// [`KvConnectorExtraConfig::from_kv_connector_extra_config`].
pub const VLLM_STORE_KEYS: [&str; 10] = [
    "cache_prefix",
    "custom_mem_pool",
    "enable_cross_layers_blocks",
    "enable_group_semantics",
    "enable_store_tp_lcm",
    "mooncake_protocol",
    "preferred_segment",
    "prefill_tp_sizes",
    "save_decode_cache",
    "store_tp_size",
];

/// The keys [`KvConnectorExtraConfig`] reads.
const LOOKUP_KEYS: [&str; 14] = [
    "enable_lookup",
    "lookup_async",
    "load_async",
    "lookup_prefetch_limit",
    "lookup_prefetch_ttl_s",
    "lookup_timeout_s",
    "lookup_priority",
    "lookup_share",
    "max_in_flight",
    "max_queued",
    "max_pending_age_s",
    "lookup_on_preemption",
    "lookup_preempted_wait_s",
    "lookup_rpc_port",
];

impl Default for KvConnectorExtraConfig {
    /// vLLM's defaults (`spec/behaviour.md`, "Configuration").
    fn default() -> Self {
        let c = Config::new(1);
        Self {
            enable_lookup: c.enable_lookup,
            lookup_async: c.lookup_async,
            load_async: c.load_async,
            lookup_prefetch_limit: c.lookup_prefetch_limit,
            lookup_prefetch_ttl: c.lookup_prefetch_ttl,
            lookup_timeout: c.lookup_timeout,
            lookup_priority: c.lookup_priority,
            lookup_share: c.lookup_share,
            max_in_flight: c.max_in_flight,
            max_queued: c.max_queued,
            max_pending_age: c.max_pending_age,
            lookup_on_preemption: c.lookup_on_preemption,
            lookup_preempted_wait: c.lookup_preempted_wait,
            lookup_rpc_port: 0,
        }
    }
}

impl KvConnectorExtraConfig {
    /// Reads vLLM's `kv_connector_extra_config` (a JSON object, as given to
    /// `--kv-transfer-config`); absent keys keep their defaults.
    ///
    /// # Errors
    /// [`Error::ExtraConfig`] naming the key: a key that is neither read here nor one
    /// of [`VLLM_STORE_KEYS`] (a typo such as `lookup_asnyc` must not silently keep
    /// the default), a value of the wrong type, or seconds that are negative, NaN,
    /// infinite (or, for `lookup_timeout_s` and `max_pending_age_s`, zero); key `kv_connector_extra_config`
    /// when `extra` is not an object.
    pub fn from_kv_connector_extra_config(extra: &Value) -> Result<Self, Error> {
        Self::read(extra, false)
    }

    /// As [`from_kv_connector_extra_config`](Self::from_kv_connector_extra_config),
    /// ignoring keys it does not know (for configs of later vLLM versions, or other
    /// connectors). A known key with a bad value is still an error.
    ///
    /// # Errors
    /// As [`from_kv_connector_extra_config`](Self::from_kv_connector_extra_config),
    /// except for unknown keys.
    pub fn from_kv_connector_extra_config_lenient(extra: &Value) -> Result<Self, Error> {
        Self::read(extra, true)
    }

    fn read(extra: &Value, lenient: bool) -> Result<Self, Error> {
        let Value::Object(map) = extra else {
            return Err(Error::ExtraConfig {
                key: "kv_connector_extra_config".to_owned(),
                why: format!("expected a JSON object, got {extra}"),
            });
        };
        let mut known = serde_json::Map::new();
        for (key, value) in map {
            if LOOKUP_KEYS.contains(&key.as_str()) {
                // One key at a time, so that a bad value's error names its key.
                let one = Value::Object([(key.clone(), value.clone())].into_iter().collect());
                serde_json::from_value::<Self>(one).map_err(|e| Error::ExtraConfig {
                    key: key.clone(),
                    why: e.to_string(),
                })?;
                known.insert(key.clone(), value.clone());
            } else if !lenient && !VLLM_STORE_KEYS.contains(&key.as_str()) {
                return Err(Error::ExtraConfig {
                    key: key.clone(),
                    why: format!("unknown key (known: {})", LOOKUP_KEYS.join(", ")),
                });
            }
        }
        serde_json::from_value(Value::Object(known)).map_err(|e| Error::ExtraConfig {
            key: "kv_connector_extra_config".to_owned(),
            why: e.to_string(),
        })
    }

    /// Puts every key into `core` (its `block_size` is not one of them: vLLM's
    /// `--block-size`).
    pub fn apply(&self, core: &mut Config) {
        core.enable_lookup = self.enable_lookup;
        core.lookup_async = self.lookup_async;
        core.load_async = self.load_async;
        core.lookup_prefetch_limit = self.lookup_prefetch_limit;
        core.lookup_prefetch_ttl = self.lookup_prefetch_ttl;
        core.lookup_timeout = self.lookup_timeout;
        core.lookup_priority = self.lookup_priority;
        core.lookup_share = self.lookup_share;
        core.max_in_flight = self.max_in_flight;
        core.max_queued = self.max_queued;
        core.max_pending_age = self.max_pending_age;
        core.lookup_on_preemption = self.lookup_on_preemption;
        core.lookup_preempted_wait = self.lookup_preempted_wait;
    }

    /// A [`Config`] with these keys and `block_size` tokens per block.
    #[must_use]
    pub fn core(&self, block_size: u32) -> Config {
        let mut core = Config::new(block_size);
        self.apply(&mut core);
        core
    }
}

/// Float seconds (vLLM's `*_s` keys) as a [`Duration`]: finite and `>= 0`
/// ([`lookup_core::duration_from_secs`]; values beyond a `Duration` saturate).
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = f64::deserialize(d)?;
        lookup_core::duration_from_secs(s).map_err(serde::de::Error::custom)
    }
}

/// As [`seconds`], and above zero (`lookup_timeout_s`: a lookup must be allowed some
/// time on the wire).
mod positive_seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = f64::deserialize(d)?;
        if s == 0.0 {
            return Err(serde::de::Error::custom(
                "0 is not a positive number of seconds",
            ));
        }
        lookup_core::duration_from_secs(s).map_err(serde::de::Error::custom)
    }
}

/// `lookup_on_preemption` by its name (`OnPreemption`'s `FromStr`: `discard`, `keep`,
/// `wait`, `keep_wait`).
mod on_preemption {
    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<lookup_core::OnPreemption, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}
