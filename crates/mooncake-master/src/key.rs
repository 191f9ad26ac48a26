//! Store keys of KV blocks as vLLM's Mooncake connector writes them (`spec/wire.md`,
//! "What the server computes", step 2):
//!
//! `[{cache_prefix}@]{model}@tp_rank:{t}@pcp{c}@dcp{d}@pp_rank:{p}@group:{g}@{hex(hash)}`
//!
//! one key per rank namespace, `hex` the lowercase hex of the block hash's bytes.

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
        let head = match cache_prefix.filter(|p| !p.is_empty()) {
            Some(prefix) => format!("{prefix}@{model}"),
            None => model.to_owned(),
        };
        let prefixes = namespaces
            .iter()
            .map(|ns| {
                format!(
                    "{head}@tp_rank:{}@pcp{}@dcp{}@pp_rank:{}@group:{}@",
                    ns.tp_rank, ns.pcp_rank, ns.dcp_rank, ns.pp_rank, ns.group
                )
            })
            .collect();
        Self { prefixes }
    }

    /// Number of rank namespaces: keys per block.
    #[must_use]
    pub fn namespaces(&self) -> usize {
        self.prefixes.len()
    }

    /// Everything before `{hex(hash)}` in namespace number `namespace`, or `None` past
    /// the end.
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
        let mut hex = String::with_capacity(2 * block_hash.len());
        push_hex(&mut hex, block_hash);
        for prefix in &self.prefixes {
            let mut key = String::with_capacity(prefix.len() + hex.len());
            key.push_str(prefix);
            key.push_str(&hex);
            out.push(key);
        }
    }
}

/// Appends the lowercase hex of `bytes` (two digits a byte), as vLLM's `hash.hex()`.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
