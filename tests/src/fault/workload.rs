//! The fault tests' workload: every request's chain has its own known hit, so an
//! answer applied to the wrong (request, num_tokens, chain) shows.

use bytes::Bytes;
use lookup_core::answer::{blocks_to_check, hit_tokens};
use lookup_core::{BlockHashes, Request, RequestId};
use lookup_tokio::KeyLayout;

use super::*;

/// splitmix64.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Hash `j` of request `id`'s chain: `id` (u64 BE) ‖ `j` (u32 BE) ‖ 20 filler bytes.
fn push_hash(out: &mut Vec<u8>, id: u64, j: u32) {
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&j.to_be_bytes());
    let mut f = mix(id ^ (u64::from(j) << 40));
    let mut filler = [0u8; 20];
    for chunk in filler.chunks_mut(8) {
        chunk.copy_from_slice(&f.to_be_bytes()[..chunk.len()]);
        f = mix(f);
    }
    out.extend_from_slice(&filler);
}

/// The chain of request `id`: [`CHAIN_BLOCKS`] hashes of [`HASH_LEN`] bytes (2,048
/// bytes), its own allocation.
pub fn chain(id: u64) -> BlockHashes {
    let mut data = Vec::with_capacity(CHAIN_BLOCKS as usize * HASH_LEN);
    for j in 0..CHAIN_BLOCKS {
        push_hash(&mut data, id, j);
    }
    BlockHashes::new(HASH_LEN as u16, Bytes::from(data)).expect("whole hashes")
}

/// Leading blocks of request `id`'s chain that are stored: 1 to 63, so requests
/// within 63 ids of each other all have different hits.
pub fn present_blocks(id: u64) -> u32 {
    1 + u32::try_from(id % 63).expect("small")
}

/// Prompt length of request `id`: 64 whole blocks and 1 to 15 more tokens, so that
/// every stored block can be loaded (the cap of rule 12 is 1,024).
pub fn num_tokens(id: u64) -> u32 {
    CHAIN_BLOCKS * B + 1 + u32::try_from(id % 15).expect("small")
}

/// The hit the server answers for request `id` (tokens).
pub fn expected_hit(id: u64) -> u32 {
    B * present_blocks(id)
}

/// A hit that is valid for request `id`'s prompt (a block multiple below its
/// `num_tokens`) but is another request's: what a misapplied or forged reply carries.
pub fn poisoned_hit(id: u64) -> u32 {
    expected_hit(id + 1)
}

/// Request `id` of the workload.
pub fn request(id: u64) -> Request {
    Request {
        request_id: RequestId(id),
        num_tokens: num_tokens(id),
        block_hashes: chain(id),
        skip_reading_external_kv: false,
    }
}

/// `(request id, block index)` of a workload hash.
pub fn parse_hash(hash: &[u8]) -> Option<(u64, u32)> {
    let id = u64::from_be_bytes(hash.get(..8)?.try_into().ok()?);
    let j = u32::from_be_bytes(hash.get(8..12)?.try_into().ok()?);
    Some((id, j))
}

/// Whether a workload hash is stored.
pub fn hash_present(hash: &[u8]) -> bool {
    hash.len() == HASH_LEN && parse_hash(hash).is_some_and(|(id, j)| j < present_blocks(id))
}

/// The reference server's answer (`spec/wire.md`, "What the server computes") for a
/// lookup of `num_tokens` over `hashes`.
pub fn chain_hit(num_tokens: u32, hashes: &BlockHashes) -> u32 {
    let blocks = blocks_to_check(num_tokens, B, hashes.len());
    let run = hashes
        .iter()
        .take(blocks)
        .take_while(|h| hash_present(h))
        .count();
    hit_tokens(num_tokens, B, run)
}

/// The request id a chain belongs to (from its first hash).
pub fn chain_owner(hashes: &BlockHashes) -> Option<u64> {
    hashes.get(0).and_then(parse_hash).map(|(id, _)| id)
}

pub(crate) fn unhex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The key layout of every server here: one namespace, model `m`.
pub fn layout() -> KeyLayout {
    KeyLayout::new("m")
}
