//! Store keys identical to vLLM's: the [`KeyLayout`] that asks for the very keys a
//! vLLM 0.33 deployment's MooncakeStoreConnector workers write, from
//! [`vllm_block_hash::StoreKeys`] (golden-vectored against vLLM's own functions).
//!
//! # What `model` must equal
//!
//! The keys begin with `[{cache_prefix}@]{model_name}{store_namespace}`. vLLM's worker
//! (`vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py`,
//! `MooncakeStoreWorker.__init__`) takes `model_name` from
//! `vllm_config.model_config.model.rstrip("/").split("/")[-1]`: the last path
//! component of the engines' `--model` (`vllm serve MODEL`), not
//! `--served-model-name`. `--model meta-llama/Llama-3.1-8B-Instruct` writes keys
//! starting `Llama-3.1-8B-Instruct@`. [`vllm_block_hash::Deployment::new`] takes the
//! raw `--model` and applies that rule ([`vllm_block_hash::model_name`]);
//! `store_namespace` (empty unless `store_tp_size` / `enable_store_tp_lcm` select a
//! TP-shared layout) and `cache_prefix` (`kv_connector_extra_config["cache_prefix"]`)
//! come from the same deployment. [`KeyLayout::new`] given by hand puts its `model`
//! verbatim: pass it the last path component, never the full Hugging Face id.
//!
//! # Rank namespaces
//!
//! A block counts only when the key of every namespace the deployment's lookup asks
//! exists. vLLM asks one namespace per distinct KV shard: with MLA every TP rank holds
//! the same latent cache (one namespace for any TP size), and with GQA at a TP size
//! above the KV-head count, the TP ranks that hold the same heads share one.
//! `RankNamespace::grid(tp, pp)` asks one per TP rank and so always misses in those
//! two cases; [`key_layout`] gets them right.

use vllm_block_hash::StoreKeys;

use crate::{Error, KeyLayout, RankNamespace};

/// The [`KeyLayout`] whose keys are byte for byte the ones `keys`' deployment looks
/// up: its cache prefix, model name and store namespace, and one [`RankNamespace`]
/// per key prefix of every KV-cache group (`StoreKeys::lookup_prefixes`). Use it for
/// [`DirectConfig`](crate::DirectConfig) (a router asking the master) or a
/// `lookup-server` with a Mooncake index, with block size
/// `keys.scheduler_block_size()`.
///
/// When the blocks span several hashes (`hash_block_size` below the block size), a
/// block is keyed by the last hash of its chunk, as vLLM's
/// `chunk_hashes_for_block_size` does ([`KeyLayout::with_hashes_per_block`]).
///
/// # Errors
/// [`Error::InvalidClientConfig`] with key `hash_block_size` when the KV-cache groups
/// have different block sizes: vLLM then keys each group's chunks separately, which
/// one [`KeyLayout`] cannot express; ask with `StoreKeys::lookup_keys` instead.
pub fn key_layout(keys: &StoreKeys) -> Result<KeyLayout, Error> {
    let hash_block_size = keys.hash_block_size();
    let block_size = keys.scheduler_block_size();
    let mut namespaces = Vec::new();
    for group in 0..keys.groups() {
        let group_block_size = keys.group_block_size(group).unwrap_or_default();
        if group_block_size != block_size {
            return Err(Error::InvalidClientConfig {
                key: "hash_block_size",
                why: format!(
                    "KV-cache group {group} has blocks of {group_block_size} tokens and the \
                     scheduler blocks of {block_size}: groups of different block sizes are \
                     keyed chunk by chunk per group, which a KeyLayout cannot express"
                ),
            });
        }
        let group_id = u32::try_from(group).unwrap_or(u32::MAX);
        for ranks in keys.lookup_ranks(group).unwrap_or_default() {
            namespaces.push(RankNamespace {
                tp_rank: ranks.tp_rank,
                pcp_rank: ranks.pcp_rank,
                dcp_rank: ranks.dcp_rank,
                pp_rank: ranks.pp_rank,
                group: group_id,
            });
        }
    }
    let invalid = |e: mooncake_master::MasterError| Error::InvalidClientConfig {
        key: "layout",
        why: e.to_string(),
    };
    let model = format!("{}{}", keys.model_name(), keys.namespace());
    KeyLayout::new(model)
        .with_cache_prefix(Some(keys.cache_prefix().to_owned()))
        .with_namespaces(namespaces)
        .map_err(invalid)?
        // Blocks larger than the hash granularity: each is keyed by its last hash
        // (`chunk_hashes_for_block_size`).
        .with_hashes_per_block((block_size / hash_block_size.max(1)) as usize)
        .map_err(invalid)
}

/// vLLM's side of a deployment, as the engine has it: `--model`, the block size,
/// and the parallel config. The block size is stated here once; the client's
/// configuration and the key layout both take it from here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VllmEngine {
    /// `--model`, raw (the keys use its last path component:
    /// [`vllm_block_hash::model_name`]).
    pub model: String,
    /// `--block-size`, tokens.
    pub block_size: u32,
    /// Tensor, pipeline and context-parallel sizes.
    pub parallelism: vllm_block_hash::Parallelism,
    /// The engine's data-parallel rank (the worker endpoint's `dp_rank`).
    pub dp_rank: u32,
    /// The model's total KV heads (`get_total_num_kv_heads()`).
    pub num_kv_heads: u32,
    /// The engine host's name, as Python's `socket.gethostname()` gives it.
    pub hostname: String,
    /// `cache_config.get_resolved_kv_cache_layout()`: it picks the TP-shared key
    /// format when `store_tp_size` or `enable_store_tp_lcm` is set (vLLM's default,
    /// `LBHNC`, otherwise changes nothing).
    pub kv_cache_layout: vllm_block_hash::KvCacheLayout,
    /// `model_config.use_mla`: the KV-cache group is MLA (one latent head, the same
    /// on every TP rank) instead of full attention.
    pub use_mla: bool,
}

/// Everything a scheduler-side client of one vLLM 0.33 engine needs, built by
/// [`VllmSetup::from_kv_transfer_config`] from the engine's whole
/// `--kv-transfer-config` JSON and its [`VllmEngine`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct VllmSetup {
    /// The lookup keys of `kv_connector_extra_config`.
    pub extra: crate::KvConnectorExtraConfig,
    /// The core configuration, block size from [`VllmEngine::block_size`].
    pub config: lookup_core::Config,
    /// The store keys the engine's workers write.
    pub store_keys: StoreKeys,
    /// Those keys as a [`KeyLayout`] (for the direct transport or a lookup server).
    pub key_layout: KeyLayout,
    /// The worker's lookup endpoint: `VLLM_RPC_BASE_PATH` (given here, read by the
    /// caller), `lookup_rpc_port`, the hostname and the dp rank
    /// ([`Endpoint::vllm`](crate::Endpoint::vllm)).
    pub endpoint: crate::Endpoint,
}

impl VllmSetup {
    /// Builds the client configuration, the key layout and the worker endpoint from
    /// the whole `--kv-transfer-config` (an object with `kv_connector_extra_config`;
    /// other top-level keys such as `kv_connector` and `kv_role` are vLLM's own and
    /// not read) and `engine`. `vllm_rpc_base_path` is `$VLLM_RPC_BASE_PATH` (`None`:
    /// the temp dir).
    ///
    /// Every key that changes the store keys takes effect, read as vLLM 0.33's
    /// `worker.py` reads it: `cache_prefix`, `enable_cross_layers_blocks`,
    /// `store_tp_size`, `enable_store_tp_lcm` with `prefill_tp_sizes`
    /// (`resolve_store_tp_size`, `_select_store_layout`: with the LCM switch on the
    /// list's least common multiple, else a positive integer `store_tp_size`; a
    /// requested store TP that does not resolve, or that the engine cannot share,
    /// gives vLLM's rank-local compatibility namespace, as its workers write).
    ///
    /// # Errors
    /// [`Error::ExtraConfig`] naming the key: `kv_connector_extra_config` when the
    /// config is not an object or that key is not one; any error of
    /// [`KvConnectorExtraConfig::from_kv_connector_extra_config`](crate::KvConnectorExtraConfig::from_kv_connector_extra_config);
    /// `cache_prefix` not a string, `enable_cross_layers_blocks` not a bool.
    /// [`Error::InvalidClientConfig`] for a deployment
    /// `vllm_block_hash` refuses (key `deployment`) or [`key_layout`] refuses.
    pub fn from_kv_transfer_config(
        kv_transfer_config: &serde_json::Value,
        engine: &VllmEngine,
        vllm_rpc_base_path: Option<&std::path::Path>,
    ) -> Result<Self, Error> {
        let bad = |key: &str, why: String| Error::ExtraConfig {
            key: key.to_owned(),
            why,
        };
        let empty = serde_json::Value::Object(serde_json::Map::new());
        let extra_json = match kv_transfer_config {
            serde_json::Value::Object(map) => {
                map.get("kv_connector_extra_config").unwrap_or(&empty)
            }
            other => {
                return Err(bad(
                    "kv_connector_extra_config",
                    format!("--kv-transfer-config must be a JSON object, got {other}"),
                ));
            }
        };
        let extra = crate::KvConnectorExtraConfig::from_kv_connector_extra_config(extra_json)?;
        let Some(map) = extra_json.as_object() else {
            return Err(bad(
                "kv_connector_extra_config",
                format!("expected a JSON object, got {extra_json}"),
            ));
        };
        let cache_prefix = match map.get("cache_prefix") {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(bad(
                    "cache_prefix",
                    format!("expected a string, got {other}"),
                ));
            }
        };
        let cross_layers = match map.get("enable_cross_layers_blocks") {
            None => false,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(other) => {
                return Err(bad(
                    "enable_cross_layers_blocks",
                    format!("expected a bool, got {other}"),
                ));
            }
        };
        let kind = if engine.use_mla {
            vllm_block_hash::AttentionKind::Mla
        } else {
            vllm_block_hash::AttentionKind::Full
        };
        let deployment = vllm_block_hash::Deployment::new(engine.model.clone(), engine.block_size)
            .with_cache_prefix(cache_prefix)
            .with_parallelism(engine.parallelism)
            .with_num_kv_heads(engine.num_kv_heads)
            .with_groups(vec![vllm_block_hash::KvCacheGroup {
                kind,
                block_size: engine.block_size,
            }])
            .with_kv_cache_layout(engine.kv_cache_layout)
            .with_store_tp(store_tp(map))
            .with_cross_layers_blocks(cross_layers);
        let store_keys = StoreKeys::new(&deployment).map_err(|e| Error::InvalidClientConfig {
            key: "deployment",
            why: e.to_string(),
        })?;
        let key_layout = key_layout(&store_keys)?;
        let config = extra.core(store_keys.scheduler_block_size());
        let endpoint = crate::Endpoint::vllm(
            vllm_rpc_base_path,
            extra.lookup_rpc_port,
            &engine.hostname,
            engine.dp_rank,
        );
        Ok(Self {
            extra,
            config,
            store_keys,
            key_layout,
            endpoint,
        })
    }
}

impl VllmSetup {
    /// The client configuration that asks the engine's own lookup worker (vLLM's
    /// `LookupKeyServer`, or `lookup-server` in its place) at [`endpoint`](Self::endpoint),
    /// with [`config`](Self::config): block size stated once, by [`VllmEngine`].
    #[must_use]
    pub fn zmq_client_config(&self) -> crate::ClientConfig {
        let mut config = crate::ClientConfig::zmq(self.endpoint.clone(), self.config.block_size);
        config.core = self.config.clone();
        config
    }

    /// The client configuration that asks the Mooncake master at `master` directly
    /// (`host:port` or `etcd://...`, [`MasterAddr`](crate::MasterAddr)) for
    /// [`key_layout`](Self::key_layout)'s keys, with [`config`](Self::config).
    #[must_use]
    pub fn direct_client_config(&self, master: crate::MasterAddr) -> crate::ClientConfig {
        let direct = crate::DirectConfig::new(master, self.key_layout.clone());
        let mut config = crate::ClientConfig::new(direct, self.config.block_size);
        config.core = self.config.clone();
        config
    }
}

/// What `kv_connector_extra_config` asks of the store's TP layout, as vLLM 0.33's
/// `_select_store_layout` and `resolve_store_tp_size` read it: requested when
/// `enable_store_tp_lcm` is `true` or `store_tp_size` is set (not `null`); then the
/// least common multiple of `prefill_tp_sizes` (a non-empty list of positive
/// integers) with the LCM switch on, else `store_tp_size` when a positive integer;
/// anything else requested resolves to nothing (vLLM's compatibility namespace).
fn store_tp(map: &serde_json::Map<String, serde_json::Value>) -> vllm_block_hash::StoreTp {
    use vllm_block_hash::StoreTp;
    let positive = |v: &serde_json::Value| {
        v.as_u64()
            .filter(|&n| n > 0)
            .and_then(|n| u32::try_from(n).ok())
    };
    let lcm = map.get("enable_store_tp_lcm") == Some(&serde_json::Value::Bool(true));
    let size = map.get("store_tp_size").filter(|v| !v.is_null());
    if lcm {
        let sizes: Option<Vec<u32>> = map
            .get("prefill_tp_sizes")
            .and_then(serde_json::Value::as_array)
            .filter(|list| !list.is_empty())
            .and_then(|list| list.iter().map(positive).collect());
        sizes.map_or(StoreTp::Unresolved, |sizes| StoreTp::lcm(&sizes))
    } else if let Some(size) = size {
        positive(size).map_or(StoreTp::Unresolved, StoreTp::Size)
    } else {
        StoreTp::NotRequested
    }
}
