//! vLLM's `kv_connector_extra_config` read with vLLM's key names
//! ([`KvConnectorExtraConfig`]): each key of [`SETTINGS`] parsed by its unit (float
//! seconds into [`Duration`]s) and checked by its own check, the one definition of
//! each setting (`lookup_core::settings`).

use std::time::Duration;

use lookup_core::settings::{SETTINGS, Unit, Value as SettingValue, setting};
use lookup_core::{Config, OnPreemption};
use serde_json::Value;

use crate::Error;

/// The lookup keys of vLLM's `kv_connector_extra_config` (`spec/behaviour.md`,
/// "Configuration"), with vLLM's names and defaults, read by
/// [`from_kv_connector_extra_config`](Self::from_kv_connector_extra_config) and put
/// into a [`Config`] by [`apply`](Self::apply).
///
/// The keys are those of [`SETTINGS`] (name, unit, default, check and meaning of
/// each; the table is `docs/configuration.md`), and `lookup_rpc_port` (integer >= 0,
/// default 0: the name in the worker's ipc path, [`Endpoint::vllm`](crate::Endpoint::vllm),
/// vLLM 0.33's `worker.py`). A test reads every setting through here and fails when
/// one is missing.
///
/// vLLM 0.33's other connector keys ([`VLLM_STORE_KEYS`]: the store's, not the
/// lookup's) are accepted and ignored, so an engine's whole extra config can be
/// passed as it is.
#[derive(Clone, Debug, PartialEq)]
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
    pub lookup_prefetch_ttl: Duration,
    /// `lookup_timeout_s`, float seconds, positive.
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
    pub max_pending_age: Duration,
    /// `lookup_on_preemption`: what a preemption does to the request's lookup
    /// (`spec/behaviour.md` rule 8).
    pub lookup_on_preemption: OnPreemption,
    /// `lookup_preempted_wait_s`, float seconds: how long a probe of a preempted
    /// request waits for its answer with `wait` or `keep_wait`.
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

/// The key of `kv_connector_extra_config` read here that is not a [`Config`] setting.
const LOOKUP_RPC_PORT: &str = "lookup_rpc_port";

/// The keys [`KvConnectorExtraConfig`] reads: every [`SETTINGS`] key, then
/// `lookup_rpc_port`.
fn lookup_keys() -> impl Iterator<Item = &'static str> {
    SETTINGS
        .iter()
        .map(|s| s.key)
        .chain(std::iter::once(LOOKUP_RPC_PORT))
}

impl Default for KvConnectorExtraConfig {
    /// vLLM's defaults (`spec/behaviour.md`, "Configuration"): [`Config::new`]'s.
    fn default() -> Self {
        Self::of(&Config::new(1), 0)
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
        let mut core = Config::new(1);
        let mut lookup_rpc_port = 0;
        for (key, value) in map {
            let named = |why: String| Error::ExtraConfig {
                key: key.clone(),
                why,
            };
            if let Some(setting) = setting(key) {
                let read = parse(setting.unit, value).map_err(named)?;
                setting.check_value(read).map_err(named)?;
                setting
                    .set(&mut core, read)
                    .map_err(|e| named(e.to_string()))?;
            } else if key == LOOKUP_RPC_PORT {
                lookup_rpc_port =
                    serde_json::from_value(value.clone()).map_err(|e| named(e.to_string()))?;
            } else if !lenient && !VLLM_STORE_KEYS.contains(&key.as_str()) {
                let known: Vec<&str> = lookup_keys().collect();
                return Err(named(format!("unknown key (known: {})", known.join(", "))));
            }
        }
        Ok(Self::of(&core, lookup_rpc_port))
    }

    /// The keys of `core`'s settings, and `lookup_rpc_port`.
    fn of(core: &Config, lookup_rpc_port: u32) -> Self {
        Self {
            enable_lookup: core.enable_lookup,
            lookup_async: core.lookup_async,
            load_async: core.load_async,
            lookup_prefetch_limit: core.lookup_prefetch_limit,
            lookup_prefetch_ttl: core.lookup_prefetch_ttl,
            lookup_timeout: core.lookup_timeout,
            lookup_priority: core.lookup_priority,
            lookup_share: core.lookup_share,
            max_in_flight: core.max_in_flight,
            max_queued: core.max_queued,
            max_pending_age: core.max_pending_age,
            lookup_on_preemption: core.lookup_on_preemption,
            lookup_preempted_wait: core.lookup_preempted_wait,
            lookup_rpc_port,
        }
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

/// One setting's JSON value read by its unit; the error says what is wrong, for the
/// caller to name the key (serde's own text for a wrong type).
fn parse(unit: Unit, value: &Value) -> Result<SettingValue, String> {
    let typed = |e: serde_json::Error| e.to_string();
    Ok(match unit {
        Unit::Switch => SettingValue::Switch(serde_json::from_value(value.clone()).map_err(typed)?),
        Unit::Count => SettingValue::Count(serde_json::from_value(value.clone()).map_err(typed)?),
        Unit::Seconds => {
            let secs: f64 = serde_json::from_value(value.clone()).map_err(typed)?;
            SettingValue::Seconds(lookup_core::duration_from_secs(secs)?)
        }
        Unit::Preemption => {
            let name: String = serde_json::from_value(value.clone()).map_err(typed)?;
            SettingValue::Preemption(name.parse::<OnPreemption>().map_err(|e| e.to_string())?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting of the one definition is read from its key and put into the
    /// core: a value other than the default, written as its unit says, comes out of
    /// [`KvConnectorExtraConfig::core`] (fails when the reader, the struct or
    /// `apply` lacks a setting).
    #[test]
    fn every_setting_is_read_from_its_key_and_applied() {
        for s in &SETTINGS {
            let (json, want) = match s.default_value() {
                SettingValue::Switch(on) => (Value::Bool(!on), SettingValue::Switch(!on)),
                SettingValue::Count(n) => (Value::from(n + 3), SettingValue::Count(n + 3)),
                SettingValue::Seconds(d) => (
                    Value::from(d.as_secs_f64() + 0.25),
                    SettingValue::Seconds(d + Duration::from_millis(250)),
                ),
                SettingValue::Preemption(_) => (
                    Value::from("discard"),
                    SettingValue::Preemption(OnPreemption::Discard),
                ),
            };
            let extra = Value::Object([(s.key.to_owned(), json)].into_iter().collect());
            let read = KvConnectorExtraConfig::from_kv_connector_extra_config(&extra)
                .unwrap_or_else(|e| panic!("{}: {e}", s.key));
            let core = read.core(16);
            assert_eq!(s.get(&core), want, "{}", s.key);
            for other in SETTINGS.iter().filter(|o| o.key != s.key) {
                assert_eq!(
                    other.get(&core),
                    other.default_value(),
                    "{} moved {}",
                    s.key,
                    other.key
                );
            }
        }
        assert_eq!(lookup_keys().collect::<Vec<_>>().len(), SETTINGS.len() + 1);
    }
}
