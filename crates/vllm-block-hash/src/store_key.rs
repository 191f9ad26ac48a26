//! The store keys of vLLM 0.33's MooncakeStoreConnector, one string at a time
//! (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/data.py `KeyMetadata`,
//! `PoolKey.build_prefix`, `PoolKey.build_key_string`; worker.py `_select_store_layout`
//! and `_make_mooncake_group_id`):
//!
//! `[{cache_prefix}@]{model_name}{store_namespace}@tp_rank:{t}@pcp{c}@dcp{d}@pp_rank:{p}@group:{g}@{hex(hash)}`
//!
//! Which ranks and hashes a deployment uses is in [`crate::deployment`].

use std::fmt;

use sha2::{Digest, Sha256};

/// The model name in the keys, from the engines' `--model` (`ModelConfig.model`), as
/// the connector's worker computes it: `model_config.model.rstrip("/").split("/")[-1]`,
/// the last `/`-separated part once trailing `/` are removed.
///
/// `"meta-llama/Llama-3.1-8B-Instruct"` gives `"Llama-3.1-8B-Instruct"`,
/// `"/models/Qwen3-8B/"` gives `"Qwen3-8B"`. `--served-model-name` plays no part.
///
/// An object-storage URI (`s3://`, `gs://`, `az://`, any case) is replaced by vLLM
/// with its local copy `{cache}/model_streamer/{sha256(uri)[:8]}` before the worker
/// reads it (`ModelConfig.maybe_pull_model_tokenizer_for_runai`), so the name is those
/// 8 hex digits. A `VLLM_MODEL_REDIRECT_PATH` redirect happens first: pass the
/// redirected value.
#[must_use]
pub fn model_name(model: &str) -> String {
    const OBJECT_STORAGE: [&str; 3] = ["s3://", "gs://", "az://"];
    let lower = model.to_ascii_lowercase();
    if OBJECT_STORAGE.iter().any(|s| lower.starts_with(s)) {
        let digest = Sha256::digest(model.as_bytes());
        let mut hex = String::with_capacity(64);
        push_hex(&mut hex, &digest);
        hex.truncate(8);
        return hex;
    }
    model
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The ranks in one key (vLLM's `RankNamespace`, `(tp, pcp, dcp, pp)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ranks {
    /// Tensor-parallel rank, or store shard id in a TP-shared layout (`tp_rank:{t}`).
    pub tp_rank: u32,
    /// Prefill context-parallel rank (`pcp{c}`).
    pub pcp_rank: u32,
    /// Decode context-parallel rank (`dcp{d}`).
    pub dcp_rank: u32,
    /// Pipeline-parallel rank (`pp_rank:{p}`).
    pub pp_rank: u32,
}

impl Ranks {
    /// Ranks `(tp, pcp, dcp, pp)`.
    #[must_use]
    pub fn new(tp_rank: u32, pcp_rank: u32, dcp_rank: u32, pp_rank: u32) -> Self {
        Self {
            tp_rank,
            pcp_rank,
            dcp_rank,
            pp_rank,
        }
    }
}

/// vLLM's `KeyMetadata`: everything in a key but the hash.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeyMetadata {
    /// `kv_connector_extra_config["cache_prefix"]` (`str()` of it); empty for none.
    pub cache_prefix: String,
    /// [`model_name`] of `--model`.
    pub model_name: String,
    /// [`StoreNamespace`] as text; empty for the historical layout.
    pub store_namespace: String,
    /// The ranks used when [`prefix_for`](Self::prefix_for) is not given others.
    pub ranks: Ranks,
    /// Index of the KV-cache group among the prefix-cacheable groups
    /// (`KVCacheConfig.prefix_cacheable_groups`); 0 for a plain model.
    pub group_id: u32,
}

impl KeyMetadata {
    /// `PoolKey.build_prefix(self)`: the key up to, not including, `@{hex(hash)}`.
    #[must_use]
    pub fn prefix(&self) -> String {
        self.prefix_for(self.ranks)
    }

    /// `PoolKey.build_prefix(self, tp_rank=..., pcp_rank=..., dcp_rank=..., pp_rank=...)`.
    #[must_use]
    pub fn prefix_for(&self, ranks: Ranks) -> String {
        let mut out = String::with_capacity(
            self.cache_prefix.len() + self.model_name.len() + self.store_namespace.len() + 64,
        );
        if !self.cache_prefix.is_empty() {
            out.push_str(&self.cache_prefix);
            out.push('@');
        }
        out.push_str(&self.model_name);
        out.push_str(&self.store_namespace);
        out.push_str(&format!(
            "@tp_rank:{}@pcp{}@dcp{}@pp_rank:{}@group:{}",
            ranks.tp_rank, ranks.pcp_rank, ranks.dcp_rank, ranks.pp_rank, self.group_id
        ));
        out
    }

    /// `_make_mooncake_group_id`: the Mooncake object group of a chunk (used with
    /// `enable_group_semantics`), `vllm-mooncake-store:[{cache_prefix}@]{model_name}{store_namespace}@{hex(hash)}`.
    /// It is not a key: ranks and the KV-cache group are not in it.
    #[must_use]
    pub fn mooncake_group_id(&self, block_hash: &[u8]) -> String {
        let mut out = String::from("vllm-mooncake-store:");
        if !self.cache_prefix.is_empty() {
            out.push_str(&self.cache_prefix);
            out.push('@');
        }
        out.push_str(&self.model_name);
        out.push_str(&self.store_namespace);
        out.push('@');
        push_hex(&mut out, block_hash);
        out
    }
}

/// `PoolKey.build_key_string(prefix, hash.hex())`: `{prefix}@{hex(hash)}`.
#[must_use]
pub fn store_key(prefix: &str, block_hash: &[u8]) -> String {
    let mut out = String::with_capacity(prefix.len() + 1 + 2 * block_hash.len());
    out.push_str(prefix);
    out.push('@');
    push_hex(&mut out, block_hash);
    out
}

/// Appends [`store_key`]`(prefix, block_hash)` for each of `prefixes`, in order (the
/// keys of one block in every namespace of a lookup, `_lookup_key_prefixes`); the hex
/// is formatted once for all of them. The one writer of a key's `@{hex(hash)}` tail,
/// shared by [`StoreKeys::lookup_keys`](crate::StoreKeys::lookup_keys) and the
/// Mooncake master client's key layout.
pub fn push_store_keys<P: AsRef<str>>(out: &mut Vec<String>, prefixes: &[P], block_hash: &[u8]) {
    let mut hex = String::with_capacity(2 * block_hash.len());
    push_hex(&mut hex, block_hash);
    out.extend(prefixes.iter().map(|prefix| {
        let prefix = prefix.as_ref();
        let mut key = String::with_capacity(prefix.len() + 1 + hex.len());
        key.push_str(prefix);
        key.push('@');
        key.push_str(&hex);
        key
    }));
}

/// Appends the lowercase hex of `bytes`, as Python's `bytes.hex()`.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
}

/// vLLM's `KVCacheLayout` (vllm/v1/kv_cache_layout.py): the physical order of a KV
/// cache's axes, named in the compatibility store namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KvCacheLayout {
    /// `[L, B, H, N, C]`, the identity.
    #[default]
    Lbhnc,
    /// `[L, B, N, H, C]`.
    Lbnhc,
    /// `[L, H, B, N, C]`.
    Lhbnc,
    /// `[B, L, H, N, C]`.
    Blhnc,
    /// `[B, L, N, H, C]`.
    Blnhc,
    /// `[B, H, L, N, C]`.
    Bhlnc,
}

impl KvCacheLayout {
    /// The enum member's name (`KVCacheLayout.name`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Lbhnc => "LBHNC",
            Self::Lbnhc => "LBNHC",
            Self::Lhbnc => "LHBNC",
            Self::Blhnc => "BLHNC",
            Self::Blnhc => "BLNHC",
            Self::Bhlnc => "BHLNC",
        }
    }
}

/// What `kv_connector_extra_config` asks of the store's TP layout
/// (`store_tp_size`, `enable_store_tp_lcm` + `prefill_tp_sizes`; worker.py
/// `resolve_store_tp_size`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StoreTp {
    /// Neither key is set: the historical keys.
    #[default]
    NotRequested,
    /// A key is set and resolves to this store TP size (`store_tp_size`, or the LCM
    /// of `prefill_tp_sizes`).
    Size(u32),
    /// A key is set but does not resolve (not a positive integer, an empty or bad
    /// `prefill_tp_sizes`): vLLM falls back to a namespaced rank-local layout.
    Unresolved,
}

impl StoreTp {
    /// `enable_store_tp_lcm: true` with `prefill_tp_sizes`: their least common
    /// multiple, [`StoreTp::Unresolved`] when the list is empty, holds a 0 or
    /// overflows.
    #[must_use]
    pub fn lcm(prefill_tp_sizes: &[u32]) -> Self {
        if prefill_tp_sizes.is_empty() || prefill_tp_sizes.contains(&0) {
            return Self::Unresolved;
        }
        let mut lcm: u64 = 1;
        for &n in prefill_tp_sizes {
            let n = u64::from(n);
            lcm = lcm / gcd(lcm, n) * n;
            if lcm > u64::from(u32::MAX) {
                return Self::Unresolved;
            }
        }
        u32::try_from(lcm).map_or(Self::Unresolved, Self::Size)
    }
}

pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The part of a key after the model name (`KeyMetadata.store_namespace`), chosen by
/// the worker's `_select_store_layout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreNamespace {
    /// `""`: the historical rank-local keys ([`StoreTp::NotRequested`]).
    #[default]
    RankLocal,
    /// `@store_tp:{store_tp_size}@store_pp:{pp_size}@store_format:tp_shared_{lbhnc|lbnhc}`:
    /// KV heads split into `store_tp_size` shards shared by engines of any TP size
    /// dividing it; the shard id takes the `tp_rank` place in the key.
    TpShared {
        /// Number of store shards.
        store_tp_size: u32,
        /// Pipeline-parallel size.
        pp_size: u32,
        /// `LBHNC` (`tp_shared_lbhnc`) or `LBNHC` (`tp_shared_lbnhc`); no other layout
        /// gets this namespace.
        layout: KvCacheLayout,
    },
    /// `@store_pp:{pp_size}@store_format:tp_shared_mqa`: a single KV head, replicated.
    TpSharedMqa {
        /// Pipeline-parallel size.
        pp_size: u32,
    },
    /// `@store_pp:{pp_size}@store_format:rank_local_tp{tp_size}_layout_{LAYOUT}`: TP
    /// sharing was asked for but is not possible; rank-local keys in their own space.
    RankLocalCompat {
        /// Tensor-parallel size of the engine.
        tp_size: u32,
        /// Pipeline-parallel size.
        pp_size: u32,
        /// The engine's resolved KV-cache layout.
        kv_cache_layout: KvCacheLayout,
    },
}

impl StoreNamespace {
    /// `_select_store_layout`: the namespace of an engine with `tp_size` × `pp_size`
    /// ranks, `num_kv_heads` KV heads (all ranks) and KV-cache layout `layout`.
    /// `tp_sharding_possible` is `_supports_tp_sharded_store_layout` without the
    /// layout test: no prefill or decode context parallelism, one KV-cache group of
    /// plain full attention, `enable_cross_layers_blocks` off.
    #[must_use]
    pub fn select(
        store_tp: StoreTp,
        tp_size: u32,
        pp_size: u32,
        num_kv_heads: u32,
        layout: KvCacheLayout,
        tp_sharding_possible: bool,
    ) -> Self {
        let requested = match store_tp {
            StoreTp::NotRequested => return Self::RankLocal,
            StoreTp::Size(n) => Some(n),
            StoreTp::Unresolved => None,
        };
        let shared_layout = matches!(layout, KvCacheLayout::Lbhnc | KvCacheLayout::Lbnhc);
        if let Some(store_tp_size) = requested
            && tp_size > 0
            && store_tp_size >= tp_size
            && store_tp_size % tp_size == 0
            && shared_layout
            && tp_sharding_possible
        {
            if num_kv_heads % store_tp_size == 0 {
                return Self::TpShared {
                    store_tp_size,
                    pp_size,
                    layout,
                };
            }
            if num_kv_heads == 1 {
                return Self::TpSharedMqa { pp_size };
            }
        }
        Self::RankLocalCompat {
            tp_size,
            pp_size,
            kv_cache_layout: layout,
        }
    }

    /// The number of store shards when keys are TP-shared.
    #[must_use]
    pub fn store_tp_size(&self) -> Option<u32> {
        match self {
            Self::TpShared { store_tp_size, .. } => Some(*store_tp_size),
            _ => None,
        }
    }
}

impl fmt::Display for StoreNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RankLocal => Ok(()),
            Self::TpShared {
                store_tp_size,
                pp_size,
                layout,
            } => write!(
                f,
                "@store_tp:{store_tp_size}@store_pp:{pp_size}@store_format:tp_shared_{}",
                layout.name().to_ascii_lowercase()
            ),
            Self::TpSharedMqa { pp_size } => {
                write!(f, "@store_pp:{pp_size}@store_format:tp_shared_mqa")
            }
            Self::RankLocalCompat {
                tp_size,
                pp_size,
                kv_cache_layout,
            } => write!(
                f,
                "@store_pp:{pp_size}@store_format:rank_local_tp{tp_size}_layout_{}",
                kv_cache_layout.name()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_key_layout() {
        let meta = KeyMetadata {
            cache_prefix: "pfx".to_owned(),
            model_name: "m".to_owned(),
            store_namespace: StoreNamespace::TpSharedMqa { pp_size: 2 }.to_string(),
            ranks: Ranks::new(3, 1, 2, 4),
            group_id: 5,
        };
        assert_eq!(
            store_key(&meta.prefix(), &[0x00, 0xab]),
            "pfx@m@store_pp:2@store_format:tp_shared_mqa@tp_rank:3@pcp1@dcp2@pp_rank:4@group:5@00ab"
        );
        assert_eq!(
            meta.mooncake_group_id(&[0x01]),
            "vllm-mooncake-store:pfx@m@store_pp:2@store_format:tp_shared_mqa@01"
        );
        let plain = KeyMetadata {
            model_name: "Qwen3-8B".to_owned(),
            ..KeyMetadata::default()
        };
        assert_eq!(
            plain.prefix_for(Ranks::new(1, 0, 0, 1)),
            "Qwen3-8B@tp_rank:1@pcp0@dcp0@pp_rank:1@group:0"
        );
    }

    #[test]
    fn object_storage_models_are_named_by_their_local_copy() {
        // hashlib.sha256(b"s3://my-bucket/models/llama-3-8b/").hexdigest()[:8]
        assert_eq!(model_name("s3://my-bucket/models/llama-3-8b/"), "b7e7c2a0");
        assert_eq!(model_name("GS://b/m"), "e4e4cfa6");
        assert_eq!(model_name("s3x://b/m"), "m");
    }

    #[test]
    fn store_tp_selection() {
        let select =
            |tp, kv, layout, ok| StoreNamespace::select(StoreTp::Size(8), tp, 1, kv, layout, ok);
        assert_eq!(
            select(4, 8, KvCacheLayout::Lbhnc, true).to_string(),
            "@store_tp:8@store_pp:1@store_format:tp_shared_lbhnc"
        );
        assert_eq!(
            select(4, 1, KvCacheLayout::Lbnhc, true),
            StoreNamespace::TpSharedMqa { pp_size: 1 }
        );
        assert_eq!(
            select(4, 8, KvCacheLayout::Lbhnc, false).to_string(),
            "@store_pp:1@store_format:rank_local_tp4_layout_LBHNC"
        );
        assert_eq!(
            StoreNamespace::select(StoreTp::NotRequested, 4, 1, 8, KvCacheLayout::Blhnc, true),
            StoreNamespace::RankLocal
        );
        assert_eq!(StoreTp::lcm(&[2, 4, 6]), StoreTp::Size(12));
        assert_eq!(StoreTp::lcm(&[]), StoreTp::Unresolved);
        assert_eq!(StoreTp::lcm(&[3, 0]), StoreTp::Unresolved);
    }
}
