//! The fake lookup server and the prompts it is asked about.
//!
//! Chains are built so that `(number of hashes, last hash)` identifies the whole
//! chain, as vLLM's chained hashes do: the first byte of hash `i` of chain `c`
//! encodes `c` (so different chains never share a hash at any length, 1 byte
//! included), the rest of the index. The store is a fixed function of the hashes: a
//! block is stored when the first byte of its hash is even.

use lookup_core::{BlockHashes, Reply, Request, RequestId, RpcBody};

use crate::transitions::ReplyValue;

/// Number of distinct chains: few, so that requests share prompts (rule 16).
pub(crate) const CHAINS: u8 = 4;
/// Largest prompt, in blocks, a probe grows a request to.
pub(crate) const MAX_BLOCKS: u32 = 10;
/// Most hashes a prompt carries beyond (or short of) its full blocks.
pub(crate) const MAX_EXTRA_HASHES: i8 = 2;

/// The block geometry of one test case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Lookup alignment `B` in tokens.
    pub(crate) block_size: u32,
    /// Bytes per block hash.
    pub(crate) hash_len: u16,
}

impl Shape {
    /// Rule 12's cap: the largest multiple of `B` strictly below `num_tokens`.
    pub(crate) fn hit_cap(self, num_tokens: u32) -> u32 {
        num_tokens.saturating_sub(1) / self.block_size * self.block_size
    }

    /// Full blocks of `num_tokens` tokens, in tokens.
    fn aligned(self, num_tokens: u32) -> u32 {
        num_tokens / self.block_size * self.block_size
    }

    /// The first `n` hashes of `chain`.
    pub(crate) fn block_hashes(self, chain: u8, n: u32) -> BlockHashes {
        let hashes: Vec<Vec<u8>> = (0..n).map(|i| self.hash(chain, i)).collect();
        BlockHashes::from_hashes(&hashes).expect("equal-length hashes")
    }

    /// Hash `i` of chain `chain` (`hash_len` bytes): the first byte is even when the
    /// block is stored and carries the chain in bits 1-2 (and `i` in bits 3-7); then
    /// the chain and the index, zero-padded or cut to the length.
    fn hash(self, chain: u8, i: u32) -> Vec<u8> {
        let low = u8::try_from(i % 32).expect("5 bits");
        let first = u8::from(!stored(chain, i)) | (chain << 1) | (low << 3);
        let mut hash = vec![first, chain];
        hash.extend_from_slice(&i.to_be_bytes());
        hash.resize(usize::from(self.hash_len), 0);
        hash
    }
}

/// Whether block `i` of chain `chain` is stored: chain 0 fully, chain 1 only its first
/// block, chain 2 all but its third (the gap ends the leading run), chain 3 nothing.
fn stored(chain: u8, i: u32) -> bool {
    match chain {
        0 => true,
        1 => i == 0,
        2 => i != 2,
        _ => false,
    }
}

/// A request's prompt as the scheduler describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prompt {
    /// Tokens so far.
    pub(crate) num_tokens: u32,
    /// Which chain its blocks hash to.
    pub(crate) chain: u8,
    /// False: the request carries no block hashes at all (rule 1).
    pub(crate) hashed: bool,
    /// Hashes beyond the full blocks (negative: fewer), when `hashed`: a scheduler
    /// may hash fewer blocks than it has, or one more than it counts as full.
    pub(crate) extra_hashes: i8,
    /// vLLM's `skip_reading_external_kv`.
    pub(crate) skip: bool,
}

/// What a lookup RPC asks: equal questions get equal answers (rule 16) and a reply
/// answers exactly its question (rule 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Question {
    /// `num_tokens` sent.
    pub(crate) num_tokens: u32,
    /// Chain of the hashes sent (0 when there are none).
    pub(crate) chain: u8,
    /// Number of hashes sent.
    pub(crate) num_hashes: u32,
}

impl Prompt {
    /// Number of block hashes: one per full block plus `extra_hashes`, or none.
    pub(crate) fn num_hashes(&self, shape: Shape) -> u32 {
        if !self.hashed {
            return 0;
        }
        let full = i64::from(self.num_tokens / shape.block_size);
        u32::try_from((full + i64::from(self.extra_hashes)).max(0)).expect("small")
    }

    /// The question a lookup of this prompt asks.
    pub(crate) fn question(&self, shape: Shape) -> Question {
        let num_hashes = self.num_hashes(shape);
        Question {
            num_tokens: self.num_tokens,
            chain: if num_hashes == 0 { 0 } else { self.chain },
            num_hashes,
        }
    }

    /// Rule 1: not skipping external KV, at least one block of tokens, a hash.
    pub(crate) fn eligible(&self, shape: Shape) -> bool {
        !self.skip && self.num_tokens >= shape.block_size && self.num_hashes(shape) > 0
    }

    /// The request the scheduler hands to the core.
    pub(crate) fn request(&self, shape: Shape, request_id: RequestId) -> Request {
        Request {
            request_id,
            num_tokens: self.num_tokens,
            block_hashes: shape.block_hashes(self.chain, self.num_hashes(shape)),
            skip_reading_external_kv: self.skip,
        }
    }
}

impl Question {
    /// The body of the RPC that asks it.
    pub(crate) fn body(&self, shape: Shape) -> RpcBody {
        RpcBody::Lookup {
            num_tokens: self.num_tokens,
            block_hashes: shape.block_hashes(self.chain, self.num_hashes),
        }
    }
}

/// What the server computes for a lookup (`spec/wire.md`, "What the server computes"),
/// read from the hash bytes themselves: the leading run of stored blocks among the
/// hashes within the aligned prompt, and on a full hit the run within
/// `num_tokens - 1`.
pub(crate) fn server_hit(shape: Shape, num_tokens: u32, hashes: &BlockHashes) -> u32 {
    let aligned = shape.aligned(num_tokens);
    if hashes.is_empty() || aligned == 0 {
        return 0;
    }
    let limit = usize::try_from(aligned / shape.block_size).expect("small");
    let run = hashes
        .iter()
        .take(limit)
        .take_while(|h| h[0] % 2 == 0)
        .count();
    let hit = u32::try_from(run).expect("small") * shape.block_size;
    if hit >= num_tokens {
        hit.min(shape.hit_cap(num_tokens))
    } else {
        hit
    }
}

/// The reply the fake server sends to an RPC with `body` (`None`: an id it cannot
/// know, answered as if asked about a 4-block prompt).
pub(crate) fn reply(shape: Shape, value: ReplyValue, body: Option<&RpcBody>) -> Reply {
    let b = shape.block_size;
    let empty = BlockHashes::empty();
    let (reset, num_tokens, hashes) = match body {
        Some(RpcBody::Reset) => (true, 4 * b, &empty),
        Some(RpcBody::Lookup {
            num_tokens,
            block_hashes,
        }) => (false, *num_tokens, block_hashes),
        None => (false, 4 * b, &empty),
    };
    let aligned = shape.aligned(num_tokens);
    let hit_tokens = match value {
        ReplyValue::Right if reset => return Reply::Reset { ok: true },
        ReplyValue::Right => server_hit(shape, num_tokens, hashes),
        ReplyValue::Valid { blocks } => (blocks * b).min(aligned),
        ReplyValue::FullPrompt => aligned,
        ReplyValue::TooHigh => aligned + b,
        ReplyValue::NotMultiple { blocks } => {
            // With `B` 1 every count is a multiple: the reply is then valid.
            let v = (blocks * b + 1).min(num_tokens);
            if b > 1 && v % b == 0 {
                v.saturating_sub(1)
            } else {
                v
            }
        }
        ReplyValue::Malformed => return Reply::Malformed,
        ReplyValue::StoreUnavailable => return Reply::StoreUnavailable,
        ReplyValue::ResetReply { ok } => return Reply::Reset { ok },
    };
    Reply::Lookup { hit_tokens }
}
