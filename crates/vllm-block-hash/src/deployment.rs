//! Which store keys a vLLM 0.33 deployment writes and asks about: the connector's rank
//! namespaces, TP replication, KV-cache groups and `hash_block_size` chunking
//! (store/worker.py `_build_token_databases`, `_init_lookup_key_prefixes`, `lookup`;
//! store/data.py `chunk_hashes_for_block_size`, `ChunkedTokenDatabase.process_tokens`,
//! the layouts' `key_for` and `lookup_key_prefixes`).
//!
//! Covered: KV-cache groups of full attention or MLA, in the connector's default
//! lookup (hits aligned to the scheduler block size). Not covered: sliding-window and
//! Mamba groups (their lookup asks a masked subset of chunks) and fine-grained
//! partial-hash hits (`cache_hit_alignment_tokens` below the scheduler block size).

use lookup_core::BlockHashes;

use crate::Error;
use crate::store_key::{
    KeyMetadata, KvCacheLayout, Ranks, StoreNamespace, StoreTp, gcd, model_name, push_store_keys,
    store_key,
};

/// Parallel sizes of one engine (`parallel_config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Parallelism {
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Prefill context-parallel size.
    pub pcp_size: u32,
    /// Decode context-parallel size.
    pub dcp_size: u32,
    /// Pipeline-parallel size.
    pub pp_size: u32,
}

impl Default for Parallelism {
    /// One rank.
    fn default() -> Self {
        Self {
            tp_size: 1,
            pcp_size: 1,
            dcp_size: 1,
            pp_size: 1,
        }
    }
}

impl Parallelism {
    /// `tp_size` tensor-parallel ranks, every other size 1; set the others by name with
    /// [`with_pcp`](Self::with_pcp), [`with_dcp`](Self::with_dcp) and
    /// [`with_pp`](Self::with_pp): `Parallelism::tp(2).with_dcp(2)` is vLLM's
    /// `--tensor-parallel-size 2 --decode-context-parallel-size 2`.
    #[must_use]
    pub fn tp(tp_size: u32) -> Self {
        Self {
            tp_size,
            ..Self::default()
        }
    }

    /// Sets the prefill context-parallel size (`--prefill-context-parallel-size`).
    #[must_use]
    pub fn with_pcp(mut self, pcp_size: u32) -> Self {
        self.pcp_size = pcp_size;
        self
    }

    /// Sets the decode context-parallel size (`--decode-context-parallel-size`,
    /// which subdivides TP: it must divide `tp_size`, as vLLM requires).
    #[must_use]
    pub fn with_dcp(mut self, dcp_size: u32) -> Self {
        self.dcp_size = dcp_size;
        self
    }

    /// Sets the pipeline-parallel size (`--pipeline-parallel-size`).
    #[must_use]
    pub fn with_pp(mut self, pp_size: u32) -> Self {
        self.pp_size = pp_size;
        self
    }

    /// Sizes `(tp, pcp, dcp, pp)`, positional; [`tp`](Self::tp) and the `with_*`
    /// methods say the same by name.
    #[must_use]
    pub fn new(tp_size: u32, pcp_size: u32, dcp_size: u32, pp_size: u32) -> Self {
        Self {
            tp_size,
            pcp_size,
            dcp_size,
            pp_size,
        }
    }
}

/// The attention type of a KV-cache group, as far as it changes keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttentionKind {
    /// `FullAttentionSpec`: each TP rank holds `num_kv_heads / tp_size` heads (or a
    /// replica when there are fewer heads than ranks).
    Full,
    /// `MLAAttentionSpec`: the latent cache, identical on every TP rank.
    Mla,
}

/// One prefix-cacheable KV-cache group, in `KVCacheConfig.prefix_cacheable_groups`
/// order (its index is the key's `group:{g}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheGroup {
    /// Attention type.
    pub kind: AttentionKind,
    /// The group's block size in tokens, after decode-context-parallel scaling (the
    /// connector's `kv_cache_spec.block_size`).
    pub block_size: u32,
}

impl KvCacheGroup {
    /// A full-attention group of `block_size` tokens.
    #[must_use]
    pub fn full(block_size: u32) -> Self {
        Self {
            kind: AttentionKind::Full,
            block_size,
        }
    }
}

/// What of a vLLM deployment decides its store keys. Build with [`Deployment::new`]
/// and the `with_*` methods, then [`StoreKeys::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployment {
    model: String,
    cache_prefix: String,
    parallelism: Parallelism,
    num_kv_heads: u32,
    groups: Vec<KvCacheGroup>,
    hash_block_size: Option<u32>,
    kv_cache_layout: KvCacheLayout,
    store_tp: StoreTp,
    cross_layers_blocks: bool,
}

impl Deployment {
    /// Engines serving `--model` `model` (the raw value; [`model_name`] is applied)
    /// with one full-attention group of `block_size` tokens, one rank, 8 KV heads, no
    /// cache prefix, the default `LBHNC` layout and no store TP. Set the model's real
    /// KV-head count with [`with_num_kv_heads`](Self::with_num_kv_heads) whenever
    /// `tp_size` may exceed it: TP ranks holding the same heads share one namespace.
    #[must_use]
    pub fn new(model: impl Into<String>, block_size: u32) -> Self {
        Self {
            model: model.into(),
            cache_prefix: String::new(),
            parallelism: Parallelism::default(),
            num_kv_heads: 8,
            groups: vec![KvCacheGroup::full(block_size)],
            hash_block_size: None,
            kv_cache_layout: KvCacheLayout::Lbhnc,
            store_tp: StoreTp::NotRequested,
            cross_layers_blocks: false,
        }
    }

    /// `kv_connector_extra_config["cache_prefix"]`; empty for none.
    #[must_use]
    pub fn with_cache_prefix(mut self, cache_prefix: impl Into<String>) -> Self {
        self.cache_prefix = cache_prefix.into();
        self
    }

    /// The engines' parallel sizes.
    #[must_use]
    pub fn with_parallelism(mut self, parallelism: Parallelism) -> Self {
        self.parallelism = parallelism;
        self
    }

    /// The model's total KV heads (`get_total_num_kv_heads()`).
    #[must_use]
    pub fn with_num_kv_heads(mut self, num_kv_heads: u32) -> Self {
        self.num_kv_heads = num_kv_heads;
        self
    }

    /// The prefix-cacheable KV-cache groups, in order (replaces the single group).
    #[must_use]
    pub fn with_groups(mut self, groups: Vec<KvCacheGroup>) -> Self {
        self.groups = groups;
        self
    }

    /// The engines' hash block size; by default the GCD of the groups' block sizes
    /// (one group: its block size), as `resolve_kv_cache_block_sizes` without
    /// `prefix_match_unit`.
    #[must_use]
    pub fn with_hash_block_size(mut self, hash_block_size: u32) -> Self {
        self.hash_block_size = Some(hash_block_size);
        self
    }

    /// The resolved KV-cache layout (`cache_config.get_resolved_kv_cache_layout()`):
    /// it matters only when store TP is requested.
    #[must_use]
    pub fn with_kv_cache_layout(mut self, layout: KvCacheLayout) -> Self {
        self.kv_cache_layout = layout;
        self
    }

    /// `store_tp_size` / `enable_store_tp_lcm` of `kv_connector_extra_config`.
    #[must_use]
    pub fn with_store_tp(mut self, store_tp: StoreTp) -> Self {
        self.store_tp = store_tp;
        self
    }

    /// `enable_cross_layers_blocks` of `kv_connector_extra_config` (it rules out
    /// TP-shared keys).
    #[must_use]
    pub fn with_cross_layers_blocks(mut self, on: bool) -> Self {
        self.cross_layers_blocks = on;
        self
    }
}

/// One group's key space.
#[derive(Clone, Debug, PartialEq, Eq)]
struct GroupKeys {
    block_size: u32,
    /// TP ranks holding byte-identical KV (`_spec_tp_replication_factor`).
    tp_replication: u32,
    /// The ranks of [`lookup_prefixes`](Self::lookup_prefixes), in the same order.
    lookup_ranks: Vec<Ranks>,
    /// The key prefixes every one of which must exist for a chunk to be a hit.
    lookup_prefixes: Vec<String>,
}

/// The store keys of a [`Deployment`]: what its lookup asks and what each worker
/// writes, byte for byte as vLLM 0.33.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreKeys {
    base: KeyMetadata,
    parallelism: Parallelism,
    namespace: StoreNamespace,
    hash_block_size: u32,
    scheduler_block_size: u32,
    groups: Vec<GroupKeys>,
}

fn bad(what: &'static str, why: impl Into<String>) -> Error {
    Error::BadDeployment {
        what,
        why: why.into(),
    }
}

impl StoreKeys {
    /// Derives the key space of `deployment`.
    ///
    /// # Errors
    /// [`Error::BadDeployment`] for a size or head count of 0, a `dcp_size` that does
    /// not divide `tp_size`, no group, a group block size that is 0 or not a multiple
    /// of the hash block size.
    pub fn new(deployment: &Deployment) -> Result<Self, Error> {
        let d = deployment;
        let p = d.parallelism;
        for (what, size) in [
            ("tp_size", p.tp_size),
            ("pcp_size", p.pcp_size),
            ("dcp_size", p.dcp_size),
            ("pp_size", p.pp_size),
            ("num_kv_heads", d.num_kv_heads),
        ] {
            if size == 0 {
                return Err(bad(what, "must be at least 1"));
            }
        }
        if p.tp_size % p.dcp_size != 0 {
            // vLLM's ParallelConfig: DCP subdivides TP.
            return Err(bad(
                "dcp_size",
                format!("{} does not divide tp_size {}", p.dcp_size, p.tp_size),
            ));
        }
        if d.groups.is_empty() {
            return Err(bad("groups", "at least one KV-cache group is needed"));
        }
        if d.groups.iter().any(|g| g.block_size == 0) {
            return Err(bad("block_size", "must be at least 1 token"));
        }
        let hash_block_size = d.hash_block_size.unwrap_or_else(|| {
            let g = d
                .groups
                .iter()
                .fold(0, |acc, g| gcd(acc, u64::from(g.block_size)));
            u32::try_from(g).unwrap_or(1)
        });
        if hash_block_size == 0 || d.groups.iter().any(|g| g.block_size % hash_block_size != 0) {
            return Err(bad(
                "hash_block_size",
                format!("{hash_block_size} must divide every group's block size"),
            ));
        }
        let mut lcm: u64 = 1;
        for g in &d.groups {
            let b = u64::from(g.block_size);
            lcm = lcm / gcd(lcm, b) * b;
        }
        let scheduler_block_size = u32::try_from(lcm).map_err(|_| {
            bad(
                "block_size",
                "the groups' least common multiple exceeds u32",
            )
        })?;

        let tp_sharding_possible = p.pcp_size == 1
            && p.dcp_size == 1
            && d.groups.len() == 1
            && d.groups[0].kind == AttentionKind::Full
            && !d.cross_layers_blocks;
        let namespace = StoreNamespace::select(
            d.store_tp,
            p.tp_size,
            p.pp_size,
            d.num_kv_heads,
            d.kv_cache_layout,
            tp_sharding_possible,
        );
        let base = KeyMetadata {
            cache_prefix: d.cache_prefix.clone(),
            model_name: model_name(&d.model),
            store_namespace: namespace.to_string(),
            ranks: Ranks::default(),
            group_id: 0,
        };
        let groups = d
            .groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                let tp_replication = tp_replication(group.kind, p, d.num_kv_heads);
                let meta = KeyMetadata {
                    group_id: g as u32,
                    ..base.clone()
                };
                let lookup_ranks: Vec<Ranks> = match namespace.store_tp_size() {
                    // TPShardedStoreLayout.lookup_key_prefixes: every shard, every pp rank.
                    Some(store_tp_size) => (0..store_tp_size)
                        .flat_map(|shard| (0..p.pp_size).map(move |pp| Ranks::new(shard, 0, 0, pp)))
                        .collect(),
                    None => lookup_namespaces(p, tp_replication),
                };
                let lookup_prefixes = lookup_ranks.iter().map(|&r| meta.prefix_for(r)).collect();
                GroupKeys {
                    block_size: group.block_size,
                    tp_replication,
                    lookup_ranks,
                    lookup_prefixes,
                }
            })
            .collect();
        Ok(Self {
            base,
            parallelism: p,
            namespace,
            hash_block_size,
            scheduler_block_size,
            groups,
        })
    }

    /// The store namespace the engines use.
    #[must_use]
    pub fn namespace(&self) -> StoreNamespace {
        self.namespace
    }

    /// The model name in the keys.
    #[must_use]
    pub fn model_name(&self) -> &str {
        &self.base.model_name
    }

    /// Tokens per block hash.
    #[must_use]
    pub fn hash_block_size(&self) -> u32 {
        self.hash_block_size
    }

    /// The scheduler block size: the LCM of the groups' block sizes, to which the
    /// lookup rounds `num_tokens` down.
    #[must_use]
    pub fn scheduler_block_size(&self) -> u32 {
        self.scheduler_block_size
    }

    /// The cache prefix in the keys (`kv_connector_extra_config["cache_prefix"]`);
    /// empty for none.
    #[must_use]
    pub fn cache_prefix(&self) -> &str {
        &self.base.cache_prefix
    }

    /// The number of prefix-cacheable KV-cache groups (the keys' `group:{g}`).
    #[must_use]
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Group `group`'s block size in tokens, or `None` past the last group.
    #[must_use]
    pub fn group_block_size(&self, group: usize) -> Option<u32> {
        self.groups.get(group).map(|g| g.block_size)
    }

    /// The ranks of group `group`'s [`lookup_prefixes`](Self::lookup_prefixes), in
    /// the same order (with a TP-shared store layout the `tp_rank` is the store
    /// shard), or `None` past the last group.
    #[must_use]
    pub fn lookup_ranks(&self, group: usize) -> Option<&[Ranks]> {
        self.groups.get(group).map(|g| g.lookup_ranks.as_slice())
    }

    /// The key prefixes of group `group` that must all exist for one of its chunks to
    /// count (`_lookup_key_prefixes[group]`), or `None` past the last group.
    #[must_use]
    pub fn lookup_prefixes(&self, group: usize) -> Option<&[String]> {
        self.groups.get(group).map(|g| g.lookup_prefixes.as_slice())
    }

    /// The keys the connector's `lookup(num_tokens, block_hashes)` asks the store
    /// about, in its order: group by group, chunk by chunk, every prefix of the group
    /// for each chunk. `block_hashes` are the request's hashes at `hash_block_size`
    /// granularity (what the scheduler sends); a group with larger blocks keys each
    /// chunk by its last hash (`chunk_hashes_for_block_size`). `num_tokens` is rounded
    /// down to the scheduler block size; no keys when that is 0 or there are no
    /// hashes.
    #[must_use]
    pub fn lookup_keys(&self, num_tokens: u32, block_hashes: &BlockHashes) -> Vec<String> {
        let token_len = num_tokens / self.scheduler_block_size * self.scheduler_block_size;
        let mut out = Vec::new();
        if block_hashes.is_empty() || token_len == 0 {
            return out;
        }
        for g in &self.groups {
            let scale = (g.block_size / self.hash_block_size) as usize;
            let chunks =
                (block_hashes.len() / scale).min(token_len.div_ceil(g.block_size) as usize);
            for chunk in 0..chunks {
                let Some(hash) = block_hashes.get(chunk * scale + scale - 1) else {
                    break;
                };
                push_store_keys(&mut out, &g.lookup_prefixes, hash);
            }
        }
        out
    }

    /// The keys worker `worker` writes when it saves the first `token_len` tokens
    /// (`ChunkedTokenDatabase.process_tokens` and the layout's `key_for`, every group
    /// in order, every local store shard of a chunk): chunk `c` of a group of block
    /// size `B` is keyed by the hash at token `min((c + 1) * B, token_len)`.
    ///
    /// # Errors
    /// [`Error::BadRank`] for a rank outside the deployment; [`Error::NotEnoughHashes`]
    /// when `token_len` is not a multiple of the hash block size or needs more
    /// hashes than given.
    pub fn put_keys(
        &self,
        worker: Ranks,
        token_len: u32,
        block_hashes: &BlockHashes,
    ) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        for (metadata, hash) in self.put_chunks(worker, token_len, block_hashes)? {
            match self.namespace.store_tp_size() {
                Some(store_tp_size) => {
                    let per_rank = store_tp_size / self.parallelism.tp_size;
                    let first = worker.tp_rank * per_rank;
                    for shard in first..first + per_rank {
                        let ranks = Ranks {
                            tp_rank: shard,
                            ..metadata.ranks
                        };
                        out.push(store_key(&metadata.prefix_for(ranks), hash));
                    }
                }
                None => out.push(store_key(&metadata.prefix(), hash)),
            }
        }
        Ok(out)
    }

    /// The Mooncake object group ids of the chunks [`put_keys`](Self::put_keys)
    /// writes (`_make_mooncake_group_id`), one per chunk and group.
    ///
    /// # Errors
    /// As [`put_keys`](Self::put_keys).
    pub fn mooncake_group_ids(
        &self,
        worker: Ranks,
        token_len: u32,
        block_hashes: &BlockHashes,
    ) -> Result<Vec<String>, Error> {
        Ok(self
            .put_chunks(worker, token_len, block_hashes)?
            .into_iter()
            .map(|(metadata, hash)| metadata.mooncake_group_id(hash))
            .collect())
    }

    /// The worker's key metadata of group `group` (`_build_token_databases`): its own
    /// ranks, with `tp_rank` divided by the group's TP replication in the rank-local
    /// layouts.
    ///
    /// # Errors
    /// [`Error::BadRank`] for a rank outside the deployment or a group past the last.
    pub fn worker_metadata(&self, worker: Ranks, group: usize) -> Result<KeyMetadata, Error> {
        let p = self.parallelism;
        for (what, rank, size) in [
            ("tp_rank", worker.tp_rank, p.tp_size),
            ("pcp_rank", worker.pcp_rank, p.pcp_size),
            ("dcp_rank", worker.dcp_rank, p.dcp_size),
            ("pp_rank", worker.pp_rank, p.pp_size),
            (
                "group",
                u32::try_from(group).unwrap_or(u32::MAX),
                self.groups.len() as u32,
            ),
        ] {
            if rank >= size {
                return Err(Error::BadRank { what, rank, size });
            }
        }
        let g = &self.groups[group];
        let tp_rank = match self.namespace.store_tp_size() {
            Some(_) => worker.tp_rank,
            None => worker.tp_rank / g.tp_replication,
        };
        Ok(KeyMetadata {
            ranks: Ranks { tp_rank, ..worker },
            group_id: group as u32,
            ..self.base.clone()
        })
    }

    /// `(worker metadata, chunk hash)` for every chunk `process_tokens` yields, group
    /// by group.
    fn put_chunks<'h>(
        &self,
        worker: Ranks,
        token_len: u32,
        block_hashes: &'h BlockHashes,
    ) -> Result<Vec<(KeyMetadata, &'h [u8])>, Error> {
        let mut out = Vec::new();
        if block_hashes.is_empty() {
            return Ok(out);
        }
        let needed = (token_len / self.hash_block_size) as usize;
        if token_len % self.hash_block_size != 0 || needed > block_hashes.len() {
            return Err(Error::NotEnoughHashes {
                token_len,
                hash_block_size: self.hash_block_size,
                hashes: block_hashes.len(),
            });
        }
        for (g, group) in self.groups.iter().enumerate() {
            let metadata = self.worker_metadata(worker, g)?;
            for chunk in 0..token_len.div_ceil(group.block_size) {
                let end = ((chunk + 1) * group.block_size).min(token_len);
                let index = (end / self.hash_block_size) as usize - 1;
                if let Some(hash) = block_hashes.get(index) {
                    out.push((metadata.clone(), hash));
                }
            }
        }
        Ok(out)
    }
}

/// `_spec_tp_replication_factor`: how many TP ranks hold the same bytes.
fn tp_replication(kind: AttentionKind, p: Parallelism, num_kv_heads: u32) -> u32 {
    if p.dcp_size > 1 {
        return 1;
    }
    match kind {
        AttentionKind::Mla => p.tp_size,
        AttentionKind::Full => (p.tp_size / num_kv_heads).max(1),
    }
}

/// `rank_namespaces(factor)` in `_init_lookup_key_prefixes`: pcp-major, then tp (or
/// one shard per distinct KV replica), then pp.
fn lookup_namespaces(p: Parallelism, tp_replication: u32) -> Vec<Ranks> {
    let mut out = Vec::new();
    for pcp in 0..p.pcp_size {
        if p.dcp_size > 1 {
            // DCP subdivides TP: dcp_rank == tp_rank % dcp_size.
            for tp in 0..p.tp_size {
                for pp in 0..p.pp_size {
                    out.push(Ranks::new(tp, pcp, tp % p.dcp_size, pp));
                }
            }
        } else {
            for shard in 0..p.tp_size / tp_replication {
                for pp in 0..p.pp_size {
                    out.push(Ranks::new(shard, pcp, 0, pp));
                }
            }
        }
    }
    out
}
