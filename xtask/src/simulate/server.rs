//! The modelled lookup server: the process that owns the store client and answers
//! the scheduler's lookups (vLLM's `LookupKeyServer` in the worker).

use lookup_core::BlockHashes;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::store::ExternalStore;
use super::trace::TRACE_BLOCK_TOKENS;

/// Latency and concurrency of the lookup server.
///
/// Defaults: ~1-2 ms per lookup, vLLM's own figure for a synchronous Mooncake lookup
/// (vLLM #45659: "each lookup costs ~1-2 ms per request on average"; LMCache #936
/// measured 1-2 ms for a `batchexist` on the Mooncake master), split into a fixed
/// part (ZeroMQ round trip and the master RPC) and a small per-key part (one existence
/// check per block and rank namespace). One request at a time, as vLLM's REP socket.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ServerParams {
    /// Fixed time per lookup (seconds). Default 0.0012.
    pub fixed_s: f64,
    /// Time per block key looked up (seconds). Default 0.000004.
    pub per_key_s: f64,
    /// Lookups served at once: 1 is vLLM's REQ/REP pair (the client also keeps at
    /// most this many on the wire, `max_in_flight`). Default 1.
    pub concurrency: u32,
    /// Upper bound of a uniform random delay added to each lookup (seconds), drawn
    /// from a generator seeded by the run's seed. Default 0 (none).
    pub jitter_s: f64,
}

impl Default for ServerParams {
    fn default() -> Self {
        Self {
            fixed_s: 0.0012,
            per_key_s: 0.000_004,
            concurrency: 1,
            jitter_s: 0.0,
        }
    }
}

/// The server's state: when each of its workers is free, and the jitter generator.
#[derive(Debug)]
pub(crate) struct LookupServer {
    params: ServerParams,
    free_at: Vec<u64>,
    rng: ChaCha8Rng,
}

/// Nanoseconds of a duration in seconds, rounded to the nearest nanosecond (so that
/// decimal parameters such as 0.01 s give exact integers). Negative or NaN: 0.
pub(crate) fn nanos(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}

impl LookupServer {
    pub(crate) fn new(params: ServerParams, seed: u64) -> Self {
        Self {
            free_at: vec![0; params.concurrency.max(1) as usize],
            params,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// A lookup for `num_tokens` with `block_hashes` reaches the server at `now`
    /// (virtual ns). Returns `(reply time, hit_tokens)`.
    ///
    /// The hit is computed when the lookup is accepted, against the store as it is
    /// then (the client never keeps more lookups on the wire than the server has
    /// workers, so acceptance is the send time).
    pub(crate) fn accept(
        &mut self,
        num_tokens: u32,
        block_hashes: &BlockHashes,
        store: &ExternalStore,
        now: u64,
    ) -> (u64, u32) {
        let (hit_tokens, keys) = hit_tokens(num_tokens, block_hashes, store);
        let worker = (0..self.free_at.len())
            .min_by_key(|&i| self.free_at[i])
            .expect("at least one worker");
        let start = now.max(self.free_at[worker]);
        let mut service = nanos(self.params.fixed_s) + nanos(self.params.per_key_s) * keys as u64;
        if self.params.jitter_s > 0.0 {
            service += self.rng.random_range(0..=nanos(self.params.jitter_s));
        }
        let done = start + service;
        self.free_at[worker] = done;
        (done, hit_tokens)
    }
}

/// What the server answers, per `spec/wire.md` "What the server computes" with block
/// size 512: the leading run of stored blocks among the first `floor(num_tokens /
/// 512)`, times 512; on a full hit (`hit >= num_tokens`) the same with
/// `num_tokens - 1`, so the last prompt token is always recomputed. Returns
/// `(hit_tokens, keys checked)`.
pub(crate) fn hit_tokens(
    num_tokens: u32,
    block_hashes: &BlockHashes,
    store: &ExternalStore,
) -> (u32, usize) {
    let ids = || {
        block_hashes.iter().map(|h| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[..8.min(h.len())]);
            u64::from_be_bytes(b)
        })
    };
    let compute = |limit: u32| -> (u32, usize) {
        let aligned_blocks = (limit / TRACE_BLOCK_TOKENS) as usize;
        if block_hashes.is_empty() || aligned_blocks == 0 {
            return (0, 0);
        }
        let keys = block_hashes.len().min(aligned_blocks);
        let run = store.leading_run(ids().take(keys));
        (run as u32 * TRACE_BLOCK_TOKENS, keys)
    };
    let (hit, keys) = compute(num_tokens);
    if hit >= num_tokens && num_tokens > 0 {
        let (hit, _) = compute(num_tokens - 1);
        return (hit, keys);
    }
    (hit, keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_hit_recomputes_the_last_token() {
        let mut store = ExternalStore::new(10);
        store.put(&[1, 2]);
        let h = BlockHashes::from_u64s(&[1, 2]);
        // 1024 tokens, both blocks stored: 1024 >= 1024, so recompute with 1023: 512.
        assert_eq!(hit_tokens(1024, &h, &store), (512, 2));
        // 1025 tokens: 1024.
        assert_eq!(hit_tokens(1025, &h, &store), (1024, 2));
        // A missing first block ends the run.
        assert_eq!(
            hit_tokens(2000, &BlockHashes::from_u64s(&[3, 1, 2]), &store),
            (0, 3)
        );
        assert_eq!(hit_tokens(511, &h, &store), (0, 0));
        assert_eq!(hit_tokens(2000, &BlockHashes::empty(), &store), (0, 0));
    }

    #[test]
    fn rep_server_serves_one_at_a_time() {
        let store = ExternalStore::new(1);
        let params = ServerParams {
            fixed_s: 0.001,
            per_key_s: 0.000_01,
            concurrency: 1,
            jitter_s: 0.0,
        };
        let mut s = LookupServer::new(params, 0);
        let h = BlockHashes::from_u64s(&[1, 2, 3]);
        assert_eq!(s.accept(2000, &h, &store, 0), (1_030_000, 0));
        // Arrives while the first is served: starts when it ends.
        assert_eq!(s.accept(2000, &h, &store, 500_000), (2_060_000, 0));
    }
}
