//! Store keys of KV blocks as vLLM's Mooncake connector writes them (`spec/wire.md`,
//! "What the server computes", step 2):
//!
//! `[{cache_prefix}@]{model}@tp_rank:{t}@pcp{c}@dcp{d}@pp_rank:{p}@group:{g}@{hex(hash)}`
//!
//! one key per rank namespace, `hex` the lowercase hex of the block hash's bytes.
//!
//! - [`RankNamespace`]: the ranks of one KV shard;
//! - [`KeyLayout`]: a deployment's model, cache prefix and namespaces, which turns
//!   block hashes into keys (what the lookup server and a direct client ask about);
//! - [`KeyFormat`]: the formatter behind it, the part before the hash built once.
//!
//! The strings themselves are written by `vllm_block_hash` (`KeyMetadata::prefix_for`,
//! `push_store_keys`, `store_key`), the one implementation of vLLM's key format,
//! golden-vectored there against vLLM's own functions; this module only chooses which
//! prefixes a lookup asks.

use std::fmt;

use vllm_block_hash::{KeyMetadata, Ranks};

use crate::MasterError;

/// One rank namespace: the ranks of the worker that stored a block's KV shard. A block
/// is present only when its key exists in every namespace of the deployment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RankNamespace {
    /// Tensor-parallel rank (`tp_rank:{t}`).
    pub tp_rank: u32,
    /// Prefill context-parallel rank (`pcp{c}`).
    pub pcp_rank: u32,
    /// Decode context-parallel rank (`dcp{d}`).
    pub dcp_rank: u32,
    /// Pipeline-parallel rank (`pp_rank:{p}`).
    pub pp_rank: u32,
    /// KV-cache group (`group:{g}`), 0 for a plain full-attention model.
    pub group: u32,
}

impl RankNamespace {
    /// The namespace of tensor-parallel rank `tp_rank`, every other rank and the group 0.
    #[must_use]
    pub fn tp(tp_rank: u32) -> Self {
        Self {
            tp_rank,
            ..Self::default()
        }
    }

    /// Every namespace of a deployment with `tp_size` tensor-parallel and `pp_size`
    /// pipeline-parallel ranks (context-parallel ranks and group 0), tp-major:
    /// `(tp 0, pp 0), (tp 0, pp 1), ..., (tp 1, pp 0), ...`. A size of 0 counts as 1.
    ///
    /// One namespace per TP rank is what vLLM asks only when every TP rank holds a
    /// distinct KV shard. With MLA (one latent cache on every rank) at TP > 1, or GQA
    /// at a TP size above the KV-head count, vLLM writes and asks fewer namespaces, so
    /// a grid always misses; `lookup_tokio::vllm::key_layout` derives vLLM's own.
    #[must_use]
    pub fn grid(tp_size: u32, pp_size: u32) -> Vec<Self> {
        let mut out = Vec::new();
        for tp_rank in 0..tp_size.max(1) {
            for pp_rank in 0..pp_size.max(1) {
                out.push(Self {
                    tp_rank,
                    pp_rank,
                    ..Self::default()
                });
            }
        }
        out
    }
}

/// Formats the keys of blocks for a fixed model, cache prefix and list of namespaces;
/// the part before the hash is formatted once per namespace, at construction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFormat {
    prefixes: Vec<String>,
}

impl KeyFormat {
    /// `cache_prefix` `None` or empty means no `{cache_prefix}@`. An empty
    /// `namespaces` gives blocks without keys, which
    /// [`MasterClient::leading_blocks`](crate::MasterClient::leading_blocks) counts as
    /// absent.
    #[must_use]
    pub fn new(cache_prefix: Option<&str>, model: &str, namespaces: &[RankNamespace]) -> Self {
        let prefixes = namespaces
            .iter()
            .map(|ns| {
                KeyMetadata {
                    cache_prefix: cache_prefix.unwrap_or_default().to_owned(),
                    model_name: model.to_owned(),
                    store_namespace: String::new(),
                    ranks: Ranks::new(ns.tp_rank, ns.pcp_rank, ns.dcp_rank, ns.pp_rank),
                    group_id: ns.group,
                }
                .prefix()
            })
            .collect();
        Self { prefixes }
    }

    /// Number of rank namespaces: keys per block.
    #[must_use]
    pub fn namespaces(&self) -> usize {
        self.prefixes.len()
    }

    /// vLLM's `PoolKey.build_prefix` of namespace number `namespace`: the key before
    /// `@{hex(hash)}`, or `None` past the end.
    #[must_use]
    pub fn prefix(&self, namespace: usize) -> Option<&str> {
        self.prefixes.get(namespace).map(String::as_str)
    }

    /// The keys of the block with hash bytes `block_hash`, one per namespace, in
    /// namespace order.
    #[must_use]
    pub fn block_keys(&self, block_hash: &[u8]) -> Vec<String> {
        let mut out = Vec::with_capacity(self.prefixes.len());
        self.push_block_keys(&mut out, block_hash);
        out
    }

    /// Appends the keys of the block with hash bytes `block_hash` to `out`, one per
    /// namespace, in namespace order; the hex is formatted once for all of them.
    pub fn push_block_keys(&self, out: &mut Vec<String>, block_hash: &[u8]) {
        vllm_block_hash::push_store_keys(out, &self.prefixes, block_hash);
    }
}

/// How block hashes become store keys (`spec/wire.md`, "What the server computes",
/// step 2):
///
/// `[{cache_prefix}@]{model}@tp_rank:{t}@pcp{c}@dcp{d}@pp_rank:{p}@group:{g}@{hex(hash)}`
///
/// with one key per [`RankNamespace`] and `hex` the lowercase hex of the hash bytes.
/// The namespace part of each key is formatted once, at construction.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyLayout {
    cache_prefix: Option<String>,
    model: String,
    namespaces: Vec<RankNamespace>,
    /// Block hashes per block (vLLM's `block_size / hash_block_size`); a block is
    /// keyed by its last hash. 1 for most deployments.
    hashes_per_block: usize,
    /// The formatter of these keys (the part before the hash, built once).
    format: KeyFormat,
}

impl fmt::Debug for KeyLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLayout")
            .field("cache_prefix", &self.cache_prefix)
            .field("model", &self.model)
            .field("namespaces", &self.namespaces)
            .field("hashes_per_block", &self.hashes_per_block)
            .finish()
    }
}

impl Default for KeyLayout {
    /// Model name `"model"`, no cache prefix, the single namespace of rank 0.
    fn default() -> Self {
        Self::new("model")
    }
}

impl KeyLayout {
    /// The layout of an unsharded deployment of `model`: no cache prefix, one namespace
    /// with every rank and the group 0.
    #[must_use]
    pub fn new(model: impl Into<String>) -> Self {
        let mut layout = Self {
            cache_prefix: None,
            model: model.into(),
            namespaces: vec![RankNamespace::default()],
            hashes_per_block: 1,
            format: KeyFormat::new(None, "", &[]),
        };
        layout.rebuild();
        layout
    }

    /// Sets the optional `{cache_prefix}@` in front of every key; `None` or an empty
    /// string means no prefix.
    #[must_use]
    pub fn with_cache_prefix(mut self, cache_prefix: Option<String>) -> Self {
        self.cache_prefix = cache_prefix.filter(|p| !p.is_empty());
        self.rebuild();
        self
    }

    /// Replaces the rank namespaces; a block is present only when its key exists in
    /// every one of them.
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] (`namespaces`) for an empty list: with no
    /// namespace every block would count as present.
    pub fn with_namespaces(mut self, namespaces: Vec<RankNamespace>) -> Result<Self, MasterError> {
        if namespaces.is_empty() {
            return Err(MasterError::InvalidConfig {
                what: "namespaces",
                why: "a key layout needs at least one rank namespace".to_owned(),
            });
        }
        self.namespaces = namespaces;
        self.rebuild();
        Ok(self)
    }

    /// Sets how many block hashes make one block: vLLM's `block_size /
    /// hash_block_size` when the KV-cache group's blocks are larger than the hash
    /// granularity (`chunk_hashes_for_block_size`). Block `b` is then keyed by hash
    /// `b * n + n - 1`, the last of its chunk; the block size the lookup aligns to is
    /// the group's.
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] (`hashes_per_block`) for 0.
    pub fn with_hashes_per_block(mut self, hashes_per_block: usize) -> Result<Self, MasterError> {
        if hashes_per_block == 0 {
            return Err(MasterError::InvalidConfig {
                what: "hashes_per_block",
                why: "a block needs at least one hash".to_owned(),
            });
        }
        self.hashes_per_block = hashes_per_block;
        Ok(self)
    }

    /// Block hashes per block (see [`with_hashes_per_block`](Self::with_hashes_per_block)).
    #[must_use]
    pub fn hashes_per_block(&self) -> usize {
        self.hashes_per_block
    }

    /// The whole blocks that `num_hashes` block hashes cover.
    #[must_use]
    pub fn blocks_of(&self, num_hashes: usize) -> usize {
        num_hashes / self.hashes_per_block
    }

    fn rebuild(&mut self) {
        self.format = KeyFormat::new(self.cache_prefix.as_deref(), &self.model, &self.namespaces);
    }

    /// The cache prefix, if any.
    #[must_use]
    pub fn cache_prefix(&self) -> Option<&str> {
        self.cache_prefix.as_deref()
    }

    /// The model name.
    #[must_use]
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The rank namespaces, never empty.
    #[must_use]
    pub fn namespaces(&self) -> &[RankNamespace] {
        &self.namespaces
    }

    /// The key of block `hash` in namespace number `namespace` (an index into
    /// [`namespaces`](Self::namespaces)), or `None` past the end.
    #[must_use]
    pub fn key(&self, namespace: usize, hash: &[u8]) -> Option<String> {
        let prefix = self.format.prefix(namespace)?;
        Some(vllm_block_hash::store_key(prefix, hash))
    }

    /// Every key of block `hash`, one per namespace, in namespace order.
    #[must_use]
    pub fn block_keys(&self, hash: &[u8]) -> Vec<String> {
        self.format.block_keys(hash)
    }

    /// The keys of the first `blocks` blocks of `block_hashes` (fewer if the chain is
    /// shorter), block-major: block 0's key in every namespace, then block 1's, ...;
    /// `blocks * namespaces().len()` keys. `block_hashes` yields each block's hash
    /// bytes in chain order (`&lookup_core::BlockHashes` does); with
    /// [`hashes_per_block`](Self::hashes_per_block) `n > 1`, block `b` is keyed by
    /// hash `b * n + n - 1` and a trailing partial chunk has no key.
    #[must_use]
    pub fn chain_keys<'h, I>(&self, block_hashes: I, blocks: usize) -> Vec<String>
    where
        I: IntoIterator<Item = &'h [u8]>,
        I::IntoIter: ExactSizeIterator,
    {
        let block_hashes = block_hashes.into_iter();
        let n = self.hashes_per_block;
        let blocks = blocks.min(block_hashes.len() / n);
        let mut out = Vec::with_capacity(blocks * self.namespaces.len());
        for hash in block_hashes.skip(n - 1).step_by(n).take(blocks) {
            self.format.push_block_keys(&mut out, hash);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use lookup_core::BlockHashes;

    use super::*;

    fn hashes(ids: &[u64]) -> BlockHashes {
        BlockHashes::from_u64s(ids)
    }

    #[test]
    fn keys_follow_the_wire_spec_layout() {
        let plain = KeyFormat::new(None, "meta-llama/Llama-3.1-8B", &[RankNamespace::default()]);
        assert_eq!(
            plain.block_keys(&[0xab, 0x01, 0xff]),
            ["meta-llama/Llama-3.1-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab01ff"]
        );
        let ns = RankNamespace {
            tp_rank: 3,
            pcp_rank: 1,
            dcp_rank: 2,
            pp_rank: 4,
            group: 5,
        };
        let sharded = KeyFormat::new(Some("pfx"), "m", &[RankNamespace::tp(0), ns]);
        assert_eq!(sharded.namespaces(), 2);
        assert_eq!(
            sharded.block_keys(&[0x00, 0x0a]),
            [
                "pfx@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@000a",
                "pfx@m@tp_rank:3@pcp1@dcp2@pp_rank:4@group:5@000a"
            ]
        );
        assert_eq!(
            KeyFormat::new(Some(""), "m", &[RankNamespace::default()]).block_keys(&[1]),
            ["m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@01"]
        );
    }

    #[test]
    fn key_format_single_namespace() {
        let layout = KeyLayout::new("meta-llama/Llama-3.1-8B");
        assert_eq!(
            layout.key(0, &[0xab, 0x01, 0xff]).unwrap(),
            "meta-llama/Llama-3.1-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab01ff"
        );
        assert_eq!(layout.key(1, &[0xab]), None);
    }

    #[test]
    fn key_format_with_cache_prefix_and_ranks() {
        let ns = RankNamespace {
            tp_rank: 3,
            pcp_rank: 1,
            dcp_rank: 2,
            pp_rank: 4,
            group: 5,
        };
        let layout = KeyLayout::new("m")
            .with_cache_prefix(Some("pfx".to_owned()))
            .with_namespaces(vec![ns])
            .unwrap();
        assert_eq!(
            layout.key(0, &[0x00, 0x0a]).unwrap(),
            "pfx@m@tp_rank:3@pcp1@dcp2@pp_rank:4@group:5@000a"
        );
        // An empty prefix is no prefix.
        let layout = layout.with_cache_prefix(Some(String::new()));
        assert_eq!(layout.cache_prefix(), None);
        assert_eq!(
            layout.key(0, &[0x10]).unwrap(),
            "m@tp_rank:3@pcp1@dcp2@pp_rank:4@group:5@10"
        );
    }

    #[test]
    fn empty_namespace_list_is_refused() {
        let err = KeyLayout::new("m").with_namespaces(Vec::new()).unwrap_err();
        assert!(matches!(
            err,
            MasterError::InvalidConfig {
                what: "namespaces",
                ..
            }
        ));
    }

    #[test]
    fn grid_is_tp_major() {
        let grid = RankNamespace::grid(2, 2);
        let pairs: Vec<(u32, u32)> = grid.iter().map(|n| (n.tp_rank, n.pp_rank)).collect();
        assert_eq!(pairs, vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
        assert_eq!(RankNamespace::grid(0, 0), vec![RankNamespace::default()]);
    }

    #[test]
    fn chain_keys_are_block_major_and_bounded_by_the_chain() {
        let layout = KeyLayout::new("m")
            .with_namespaces(RankNamespace::grid(2, 1))
            .unwrap();
        let keys = layout.chain_keys(&hashes(&[1, 2]), 5);
        assert_eq!(
            keys,
            vec![
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0000000000000001",
                "m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@0000000000000001",
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0000000000000002",
                "m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@0000000000000002",
            ]
        );
        assert_eq!(layout.chain_keys(&hashes(&[1, 2]), 1).len(), 2);
        assert!(layout.chain_keys(&BlockHashes::empty(), 3).is_empty());
    }

    #[test]
    fn a_block_of_several_hashes_is_keyed_by_its_last_hash() {
        let layout = KeyLayout::new("m").with_hashes_per_block(2).unwrap();
        assert_eq!(layout.hashes_per_block(), 2);
        assert_eq!(layout.blocks_of(5), 2);
        // Five hashes: blocks (1, 2) and (3, 4); hash 5 is a partial chunk, no key.
        assert_eq!(
            layout.chain_keys(&hashes(&[1, 2, 3, 4, 5]), 9),
            vec![
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0000000000000002",
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0000000000000004",
            ]
        );
        assert_eq!(layout.chain_keys(&hashes(&[1, 2, 3]), 9).len(), 1);
        assert_eq!(
            KeyLayout::new("m")
                .with_hashes_per_block(0)
                .unwrap_err()
                .to_string(),
            "invalid master client configuration: hashes_per_block: a block needs at least one hash"
        );
    }
}
