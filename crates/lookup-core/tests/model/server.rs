//! The fake lookup server and the prompts it is asked about.
//!
//! Chains are built so that `(number of hashes, last hash)` identifies the whole
//! chain, as vLLM's chained hashes do: hash `i` of chain `c` encodes `(c, i)`, so two
//! prompts of one chain share their prefix and different chains share nothing. The
//! store is a fixed function of the hashes: a block is stored when the first byte of
//! its hash is even.

use lookup_core::{BlockHashes, Reply, Request, RequestId, RpcBody};

use crate::transitions::ReplyValue;

/// Lookup alignment `B` in tokens.
pub(crate) const BLOCK_SIZE: u32 = 16;
/// Number of distinct chains: few, so that requests share prompts (rule 16).
pub(crate) const CHAINS: u8 = 4;
/// Largest prompt (tokens) a probe grows a request to.
pub(crate) const MAX_TOKENS: u32 = 160;

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

/// Hash `i` of chain `chain` (8 bytes): first byte even when stored, then the chain
/// and the index, which make it unique.
fn hash(chain: u8, i: u32) -> [u8; 8] {
    let first = 0x10 + 2 * chain + u8::from(!stored(chain, i));
    let i = i.to_be_bytes();
    [first, chain, i[0], i[1], i[2], i[3], 0, 0]
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
    /// Number of block hashes: one per full block, or none.
    pub(crate) fn num_hashes(&self) -> u32 {
        if self.hashed {
            self.num_tokens / BLOCK_SIZE
        } else {
            0
        }
    }

    /// The question a lookup of this prompt asks.
    pub(crate) fn question(&self) -> Question {
        let num_hashes = self.num_hashes();
        Question {
            num_tokens: self.num_tokens,
            chain: if num_hashes == 0 { 0 } else { self.chain },
            num_hashes,
        }
    }

    /// The request the scheduler hands to the core.
    pub(crate) fn request(&self, request_id: RequestId) -> Request {
        Request {
            request_id,
            num_tokens: self.num_tokens,
            block_hashes: block_hashes(self.chain, self.num_hashes()),
            skip_reading_external_kv: self.skip,
        }
    }
}

impl Question {
    /// The body of the RPC that asks it.
    pub(crate) fn body(&self) -> RpcBody {
        RpcBody::Lookup {
            num_tokens: self.num_tokens,
            block_hashes: block_hashes(self.chain, self.num_hashes),
        }
    }
}

/// The first `n` hashes of `chain`.
pub(crate) fn block_hashes(chain: u8, n: u32) -> BlockHashes {
    let hashes: Vec<[u8; 8]> = (0..n).map(|i| hash(chain, i)).collect();
    BlockHashes::from_hashes(&hashes).expect("equal-length hashes")
}

/// Rule 12's cap: the largest multiple of `B` strictly below `num_tokens`.
pub(crate) fn hit_cap(num_tokens: u32) -> u32 {
    num_tokens.saturating_sub(1) / BLOCK_SIZE * BLOCK_SIZE
}

/// What the server computes for a lookup (`spec/wire.md`, "What the server computes"),
/// read from the hash bytes themselves: the leading run of stored blocks within the
/// aligned prompt, and on a full hit the run within `num_tokens - 1`.
pub(crate) fn server_hit(num_tokens: u32, hashes: &BlockHashes) -> u32 {
    let aligned = num_tokens / BLOCK_SIZE * BLOCK_SIZE;
    if hashes.is_empty() || aligned == 0 {
        return 0;
    }
    let limit = usize::try_from(aligned / BLOCK_SIZE).expect("small");
    let run = hashes
        .iter()
        .take(limit)
        .take_while(|h| h[0] % 2 == 0)
        .count();
    let hit = u32::try_from(run).expect("small") * BLOCK_SIZE;
    if hit >= num_tokens {
        hit.min(hit_cap(num_tokens))
    } else {
        hit
    }
}

/// The reply the fake server sends to an RPC with `body` (`None`: an id it cannot
/// know, answered as if asked about a 64-token prompt).
pub(crate) fn reply(value: ReplyValue, body: Option<&RpcBody>) -> Reply {
    let empty = BlockHashes::empty();
    let (reset, num_tokens, hashes) = match body {
        Some(RpcBody::Reset) => (true, 64, &empty),
        Some(RpcBody::Lookup {
            num_tokens,
            block_hashes,
        }) => (false, *num_tokens, block_hashes),
        None => (false, 64, &empty),
    };
    let aligned = num_tokens / BLOCK_SIZE * BLOCK_SIZE;
    let hit_tokens = match value {
        ReplyValue::Right if reset => return Reply::Reset { ok: true },
        ReplyValue::Right => server_hit(num_tokens, hashes),
        ReplyValue::Valid { blocks } => (blocks * BLOCK_SIZE).min(aligned),
        ReplyValue::FullPrompt => aligned,
        ReplyValue::TooHigh => aligned + BLOCK_SIZE,
        ReplyValue::NotMultiple { blocks } => {
            let v = (blocks * BLOCK_SIZE + 1).min(num_tokens);
            if v % BLOCK_SIZE == 0 { v - 1 } else { v }
        }
        ReplyValue::Malformed => return Reply::Malformed,
        ReplyValue::ResetReply { ok } => return Reply::Reset { ok },
    };
    Reply::Lookup { hit_tokens }
}
