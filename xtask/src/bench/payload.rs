//! The one lookup every row of the benchmark sends.

use bytes::Bytes;
use lookup_core::wire::{self, Format, LookupReply};
use lookup_core::{BlockHashes, Request, RequestId};
use lookup_server::{InMemoryIndex, KeyLayout};

/// The benchmark's lookup: `blocks` block hashes of `hash_len` bytes (hash `i` is
/// `hash_len` bytes of value `i mod 256`, the bytes the Python script builds too), a
/// prompt of `blocks × block_size + 1` tokens, in `tagged-blob`, against a store that
/// holds every block: each lookup answers `blocks × block_size` hit tokens.
#[derive(Clone, Debug)]
pub struct Payload {
    /// Block size `B` (tokens).
    pub block_size: u32,
    /// The prompt length (tokens): one more than the blocks cover, so the full-hit
    /// rule does not shorten the answer (`spec/wire.md`, "What the server computes").
    pub num_tokens: u32,
    /// The request's block hashes.
    pub block_hashes: BlockHashes,
    /// The four `tagged-blob` request frames (`spec/wire.md`), as the bare loop sends
    /// them.
    pub frames: Vec<Bytes>,
    /// The reply frame the server sends (4 bytes of hit tokens, no boundaries).
    pub reply: Bytes,
    /// Hit tokens every lookup must get (tokens).
    pub hit_tokens: u32,
}

impl Payload {
    /// The payload of `blocks` hashes of `hash_len` bytes with a block size of
    /// `block_size` tokens.
    ///
    /// # Errors
    /// When `hash_len` is 0 or above `u16::MAX` bytes, `block_size` is 0, or the token
    /// count does not fit a `u32`.
    pub fn new(blocks: usize, hash_len: usize, block_size: u32) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (1..=usize::from(u16::MAX)).contains(&hash_len),
            "hash length {hash_len} bytes is outside 1..=65535"
        );
        anyhow::ensure!(block_size > 0, "block size must be at least 1 token");
        let hashes: Vec<Vec<u8>> = (0..blocks)
            .map(|i| vec![(i % 256) as u8; hash_len])
            .collect();
        let block_hashes = BlockHashes::from_hashes(&hashes)?;
        let hit_tokens = u32::try_from(blocks)
            .ok()
            .and_then(|b| b.checked_mul(block_size))
            .ok_or_else(|| {
                anyhow::anyhow!("{blocks} blocks of {block_size} tokens overflow u32")
            })?;
        let num_tokens = hit_tokens
            .checked_add(1)
            .ok_or_else(|| anyhow::anyhow!("prompt length overflows u32"))?;
        let frames = wire::encode_lookup(Format::TaggedBlob, num_tokens, block_size, &block_hashes);
        let reply = wire::encode_lookup_reply(
            Format::TaggedBlob,
            &LookupReply {
                hit_tokens,
                boundaries: Vec::new(),
            },
        );
        Ok(Self {
            block_size,
            num_tokens,
            block_hashes,
            frames,
            reply,
            hit_tokens,
        })
    }

    /// The request with id `request_id` and this payload.
    #[must_use]
    pub fn request(&self, request_id: u64) -> Request {
        Request {
            request_id: RequestId(request_id),
            num_tokens: self.num_tokens,
            block_hashes: self.block_hashes.clone(),
            skip_reading_external_kv: false,
        }
    }

    /// An in-memory store holding every block of the payload under `layout`.
    #[must_use]
    pub fn index(&self, layout: &KeyLayout) -> InMemoryIndex {
        let index = InMemoryIndex::new();
        index.insert_chain(layout, &self.block_hashes, self.block_hashes.len());
        index
    }

    /// Bytes of the request's frames together.
    #[must_use]
    pub fn request_bytes(&self) -> usize {
        self.frames.iter().map(Bytes::len).sum()
    }
}
