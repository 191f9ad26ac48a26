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
