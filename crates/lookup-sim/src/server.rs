//! The modelled lookup server: the process that owns the store client and answers
//! the scheduler's lookups (vLLM's `LookupKeyServer` in the worker, or this project's
//! `lookup-server`), and what a lookup costs it: the store keys it asks about, in the
//! calls it makes, present and absent.

use std::cell::RefCell;
use std::rc::Rc;

use lookup_core::BlockHashes;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::store::ExternalStore;
use super::trace::TRACE_BLOCK_TOKENS;

/// Latency, key pattern and concurrency of the lookup server.
///
/// A lookup for `num_tokens` asks about one store key per vLLM block of
/// `block_size` tokens and rank namespace (`spec/wire.md`, "What the server
/// computes", step 2): a 12,000-token prompt at block size 16 is 750 blocks, so 750
/// keys per namespace. The keys go to the store in calls of at most `chunk_keys` keys
/// (whole blocks per call), one call after another, stopping after the call that
/// ends the leading run (this project's `lookup-server --mooncake-master` and direct
/// transport, `MasterClient::leading_blocks`); `chunk_keys` 0 is one call with every
/// key and no early stop (vLLM's worker, one `batch_is_exist`). A lookup then costs
///
/// `fixed_s + calls × per_call_s + present keys × present_key_s + absent keys × absent_key_s`
///
/// plus a uniform jitter in `[0, jitter_s]`. Presence follows the store at 512-token
/// granularity (the trace's ids say nothing finer): every vLLM block of a stored trace
/// block is present, the vLLM blocks of a prompt's partial trace block are absent.
///
/// Defaults: the `vllm-python` profile of the built-in calibration (see
/// [`Calibration`](super::calibration::Calibration) and `crates/lookup-sim/calibration.json` for
/// the machine, the date and the other servers measured): a server that builds its
/// keys in Python and asks the real master once per lookup, as vLLM's worker does
/// (one call, no early stop); an 8B model on one GPU (one namespace), vLLM's default
/// block size, one lookup at a time (vLLM's REQ/REP pair). `--server-profile
/// lookup-server-mooncake` models this project's server instead.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServerParams {
    /// Fixed time per lookup (seconds): the ZeroMQ round trip and the server's own
    /// work per message.
    pub fixed_s: f64,
    /// Time per store call (seconds): one `BatchExistKey` round trip to the master.
    pub per_call_s: f64,
    /// Time per key asked that is present (seconds).
    pub present_key_s: f64,
    /// Time per key asked that is absent (seconds).
    pub absent_key_s: f64,
    /// vLLM's block size (tokens per store key and namespace). Must divide 512, the
    /// trace's block. Default 16, vLLM's default.
    pub block_size: u32,
    /// Rank namespaces (tensor-parallel ranks, pipeline ranks): keys per vLLM block.
    /// Default 1 (an 8B model on one GPU).
    pub namespaces: u32,
    /// Keys per store call at most (whole blocks per call, at least one block), with
    /// an early stop after the call that ends the leading run; 0: one call with every
    /// key, no early stop. Default 1,024 (`MasterConfig::chunk_keys`).
    pub chunk_keys: u32,
    /// Lookups served at once: 1 is vLLM's REQ/REP pair (the client also keeps at
    /// most this many on the wire, `max_in_flight`). Default 1.
    pub concurrency: u32,
    /// Upper bound of a uniform random delay added to each lookup (seconds), drawn
    /// from a generator seeded by the run's seed.
    pub jitter_s: f64,
    /// One server for every engine (its `concurrency` workers shared), as `cargo xtask
    /// replay` runs it, instead of one per engine (vLLM's worker in each engine).
    /// Lookups then wait for a worker on the wire. Default false.
    #[serde(default)]
    pub shared: bool,
}

impl ServerParams {
    /// Checks what the model cannot run with.
    ///
    /// # Errors
    /// A duration that is negative, NaN or infinite; a block size that does not divide
    /// 512 tokens; 0 namespaces or a concurrency of 0. Each message names the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (flag, v) in [
            ("--server-fixed-ms", self.fixed_s * 1e3),
            ("--server-per-call-us", self.per_call_s * 1e6),
            ("--server-per-key-us", self.present_key_s * 1e6),
            ("--absent-key-us", self.absent_key_s * 1e6),
            ("--server-jitter-ms", self.jitter_s * 1e3),
        ] {
            if !v.is_finite() || v < 0.0 {
                anyhow::bail!("{flag} must be a finite number >= 0, got {v}");
            }
        }
        if self.block_size == 0 || TRACE_BLOCK_TOKENS % self.block_size != 0 {
            anyhow::bail!(
                "--block-size must divide the trace's {TRACE_BLOCK_TOKENS}-token block, got {}",
                self.block_size
            );
        }
        if self.namespaces == 0 {
            anyhow::bail!("--namespaces must be at least 1");
        }
        if self.concurrency == 0 {
            anyhow::bail!("--server-concurrency must be at least 1");
        }
        Ok(())
    }

    /// Service time of a lookup that asks `keys` (ns, without jitter).
    #[must_use]
    pub fn service_ns(&self, keys: &KeyCount) -> u64 {
        nanos(self.fixed_s)
            + u64::from(keys.calls) * nanos(self.per_call_s)
            + nanos_f(f64::from(keys.present) * self.present_key_s)
            + nanos_f(f64::from(keys.absent) * self.absent_key_s)
    }
}

/// What one lookup asks the store: calls, and keys present and absent among those
/// asked. `in_prompt` is every key of the prompt (what a server without early stop
/// would ask).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KeyCount {
    /// Store calls (`BatchExistKey`).
    pub calls: u32,
    /// Keys asked that exist.
    pub present: u32,
    /// Keys asked that do not.
    pub absent: u32,
    /// Keys of the prompt: vLLM blocks × namespaces.
    pub in_prompt: u32,
}

impl KeyCount {
    /// Keys asked.
    #[must_use]
    pub fn asked(&self) -> u32 {
        self.present + self.absent
    }
}

/// The keys a lookup for `num_tokens` asks, given `trace_blocks` full 512-token
/// blocks with hashes, the leading run `run` of them stored, and `stored(i)` telling
/// whether trace block `i` is stored (asked only past the run, within the last call).
#[must_use]
pub fn key_count(
    p: &ServerParams,
    num_tokens: u32,
    trace_blocks: usize,
    run: usize,
    stored: impl Fn(usize) -> bool,
) -> KeyCount {
    let bs = p.block_size.max(1) as usize;
    let per_trace = (TRACE_BLOCK_TOKENS as usize / bs).max(1);
    let ns = p.namespaces as usize;
    let blocks = num_tokens as usize / bs;
    if blocks == 0 || ns == 0 {
        return KeyCount::default();
    }
    let per_call = match p.chunk_keys as usize {
        0 => blocks,
        c => (c / ns).max(1),
    };
    let lead = (run * per_trace).min(blocks);
    let calls = if lead >= blocks {
        blocks.div_ceil(per_call)
    } else {
        lead / per_call + 1
    };
    let asked = blocks.min(calls * per_call);
    // Present blocks past the first missing one, inside the last call.
    let mut present = lead;
    let mut t = lead / per_trace + 1;
    while t * per_trace < asked {
        if t < trace_blocks && stored(t) {
            present += ((t + 1) * per_trace).min(asked) - t * per_trace;
        }
        t += 1;
    }
    let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    KeyCount {
        calls: to_u32(calls),
        present: to_u32(present * ns),
        absent: to_u32((asked - present) * ns),
        in_prompt: to_u32(blocks * ns),
    }
}

/// What the server did with one lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Served {
    /// Virtual time of the reply (ns).
    pub(crate) done: u64,
    /// Hit tokens answered.
    pub(crate) hit_tokens: u32,
    /// Keys asked.
    pub(crate) keys: KeyCount,
}

/// When each worker of a server is free (ns); shared by the engines' handles of a
/// shared server.
pub(crate) type Workers = Rc<RefCell<Vec<u64>>>;

/// The server's state: when each of its workers is free, and the jitter generator.
#[derive(Debug)]
pub(crate) struct LookupServer {
    params: ServerParams,
    free_at: Workers,
    rng: ChaCha8Rng,
}

/// Nanoseconds of a duration in seconds, rounded to the nearest nanosecond (so that
/// decimal parameters such as 0.01 s give exact integers). Negative or NaN: 0.
pub(crate) fn nanos(seconds: f64) -> u64 {
    nanos_f(seconds)
}

fn nanos_f(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}

impl LookupServer {
    /// A server of its own (`workers` `None`) or a handle on a shared one.
    pub(crate) fn new(params: ServerParams, seed: u64, workers: Option<Workers>) -> Self {
        Self {
            free_at: workers.unwrap_or_else(|| Self::workers(&params)),
            params,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The workers of a server with `params`, all free.
    pub(crate) fn workers(params: &ServerParams) -> Workers {
        Rc::new(RefCell::new(vec![0; params.concurrency.max(1) as usize]))
    }

    /// A lookup for `num_tokens` with `block_hashes` (one per full 512-token block)
    /// reaches the server at `now` (virtual ns).
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
    ) -> Served {
        let ids: Vec<u64> = block_hashes.iter().map(id_of).collect();
        let (hit_tokens, run) = hit_tokens(num_tokens, &ids, store);
        let keys = key_count(&self.params, num_tokens, ids.len(), run, |i| {
            store.contains(ids[i])
        });
        let mut free_at = self.free_at.borrow_mut();
        let worker = (0..free_at.len())
            .min_by_key(|&i| free_at[i])
            .expect("at least one worker");
        let start = now.max(free_at[worker]);
        let mut service = self.params.service_ns(&keys);
        if self.params.jitter_s > 0.0 {
            service += self.rng.random_range(0..=nanos(self.params.jitter_s));
        }
        let done = start + service;
        free_at[worker] = done;
        Served {
            done,
            hit_tokens,
            keys,
        }
    }
}

/// The trace id a block hash was made from (`BlockHashes::from_u64s`, big-endian).
fn id_of(h: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = h.len().min(8);
    b[..n].copy_from_slice(&h[..n]);
    u64::from_be_bytes(b)
}

/// What the server answers, per `spec/wire.md` "What the server computes" at the
/// trace's 512-token granularity: the leading run of stored blocks among the first
/// `floor(num_tokens / 512)`, times 512; on a full hit (`hit >= num_tokens`) the same
/// with `num_tokens - 1`, so the last prompt token is always recomputed. Returns
/// `(hit_tokens, leading run in blocks)`.
pub(crate) fn hit_tokens(num_tokens: u32, ids: &[u64], store: &ExternalStore) -> (u32, usize) {
    let aligned = (num_tokens / TRACE_BLOCK_TOKENS) as usize;
    if ids.is_empty() || aligned == 0 {
        return (0, 0);
    }
    let run = store.leading_run(ids.iter().take(aligned).copied());
    let mut blocks = run as u32;
    if blocks * TRACE_BLOCK_TOKENS >= num_tokens {
        blocks = blocks.min((num_tokens - 1) / TRACE_BLOCK_TOKENS);
    }
    (blocks * TRACE_BLOCK_TOKENS, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(block_size: u32, namespaces: u32, chunk_keys: u32) -> ServerParams {
        ServerParams {
            fixed_s: 0.001,
            per_call_s: 0.000_1,
            present_key_s: 0.000_001,
            absent_key_s: 0.000_000_5,
            block_size,
            namespaces,
            chunk_keys,
            concurrency: 1,
            jitter_s: 0.0,
            shared: false,
        }
    }

    #[test]
    fn full_hit_recomputes_the_last_token() {
        let mut store = ExternalStore::new(10);
        store.put(&[1, 2]);
        // 1024 tokens, both blocks stored: 1024 >= 1024, so recompute with 1023: 512.
        assert_eq!(hit_tokens(1024, &[1, 2], &store), (512, 2));
        // 1025 tokens: 1024.
        assert_eq!(hit_tokens(1025, &[1, 2], &store), (1024, 2));
        // A missing first block ends the run.
        assert_eq!(hit_tokens(2000, &[3, 1, 2], &store), (0, 0));
        assert_eq!(hit_tokens(511, &[1, 2], &store), (0, 0));
        assert_eq!(hit_tokens(2000, &[], &store), (0, 0));
    }

    #[test]
    fn keys_follow_block_size_namespaces_and_the_early_stop() {
        // 1,100 tokens at block size 16: 68 vLLM blocks (64 in the two full trace
        // blocks, 4 in the partial third); 2 namespaces: 136 keys in the prompt.
        let stored = |i: usize| i == 1; // block 0 missing, block 1 stored
        // Chunks of 64 keys = 32 blocks = one trace block: the first call (block 0,
        // absent) ends the run.
        let k = key_count(&params(16, 2, 64), 1100, 2, 0, stored);
        assert_eq!(
            k,
            KeyCount {
                calls: 1,
                present: 0,
                absent: 64,
                in_prompt: 136
            }
        );
        // One call for everything (vLLM's worker): block 1's 64 keys are present.
        let k = key_count(&params(16, 2, 0), 1100, 2, 0, stored);
        assert_eq!((k.calls, k.present, k.absent), (1, 64, 72));
        // Run of 2 trace blocks = 64 vLLM blocks; chunks of 40 keys = 20 blocks: the
        // run ends in the fourth call (blocks 60..80, capped at 68), which asks 8
        // blocks: 4 present, 4 absent (the partial block).
        let k = key_count(&params(16, 2, 40), 1100, 2, 2, |_| true);
        assert_eq!((k.calls, k.present, k.absent), (4, 128, 8));
        // Block size 512: one key per trace block and namespace.
        let k = key_count(&params(512, 1, 1024), 1100, 2, 2, |_| true);
        assert_eq!((k.calls, k.present, k.absent, k.in_prompt), (1, 2, 0, 2));
        // Costs: 1 ms + 4 × 0.1 ms + 128 × 1 µs + 8 × 0.5 µs.
        let k = key_count(&params(16, 2, 40), 1100, 2, 2, |_| true);
        assert_eq!(params(16, 2, 40).service_ns(&k), 1_532_000);
        // Fewer tokens than a block: nothing asked.
        assert_eq!(
            key_count(&params(16, 1, 0), 15, 0, 0, |_| true),
            KeyCount::default()
        );
    }

    #[test]
    fn rep_server_serves_one_at_a_time() {
        let store = ExternalStore::new(1);
        let mut s = LookupServer::new(params(512, 1, 1024), 0, None);
        let h = BlockHashes::from_u64s(&[1, 2, 3]);
        // 2000 tokens: 3 blocks asked, the first absent ends the run: one call of 3
        // absent keys: 1 ms + 0.1 ms + 1.5 µs.
        let first = s.accept(2000, &h, &store, 0);
        assert_eq!((first.done, first.hit_tokens), (1_101_500, 0));
        // Arrives while the first is served: starts when it ends.
        assert_eq!(s.accept(2000, &h, &store, 500_000).done, 2_203_000);
        // Two handles on one shared server queue on its one worker.
        let shared = LookupServer::workers(&params(512, 1, 1024));
        let mut a = LookupServer::new(params(512, 1, 1024), 0, Some(Rc::clone(&shared)));
        let mut b = LookupServer::new(params(512, 1, 1024), 1, Some(shared));
        assert_eq!(a.accept(2000, &h, &store, 0).done, 1_101_500);
        assert_eq!(b.accept(2000, &h, &store, 0).done, 2_203_000);
    }
}
