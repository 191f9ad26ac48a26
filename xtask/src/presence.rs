//! `cargo xtask presence`: how many master keys the lease-backed presence cache saves,
//! on the Mooncake traces and on a generated workload with shared system prompts.
//!
//! Offline and deterministic: the real planner and cache of `mooncake_master::batch`
//! ([`LeadingRuns`], [`PresenceCache`]) on a virtual clock, over a modelled store.
//! Each request is one lookup at its arrival, over its full vLLM blocks (block size
//! `--block-size`, 16 by default: a trace hash id covers 512 tokens, so 32 blocks),
//! with the early stop of one chunked query (`--chunk-keys`). The store holds every
//! block of every request that arrived before (written at its prefill, no eviction),
//! so a lookup's answer is the longest stored prefix. With the cache, a key answered
//! present is not asked again while `now + result_ttl` is before the reply's time plus
//! the lease (`--lease-s`, 10 s: the master's `default_kv_lease_ttl`) and `--max-age-s`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use lookup_tokio::mooncake_master::batch::{LeadingRuns, PresenceCache};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::simulate::trace::{TRACE_BLOCK_TOKENS, TraceRequest, load};

/// `cargo xtask presence` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Traces to measure (Mooncake JSONL); default: both traces in `../shared/traces/`
    /// when present.
    #[arg(long)]
    pub trace: Vec<PathBuf>,
    /// vLLM block size in tokens.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Keys per `BatchExistKey` call (the master client's `chunk_keys`).
    #[arg(long, default_value_t = 1024)]
    pub chunk_keys: usize,
    /// The master's read lease, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub lease_s: f64,
    /// The cache's own bound, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub max_age_s: f64,
    /// How long a lookup result is used after its reply (`lookup_prefetch_ttl_s`),
    /// seconds: a cached key must stay leased that much longer.
    #[arg(long, default_value_t = 2.0)]
    pub result_ttl_s: f64,
    /// Generated workload: requests per second.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Generated workload: requests.
    #[arg(long, default_value_t = 4000)]
    pub requests: usize,
    /// Generated workload: system prompts (each request uses one, chosen uniformly).
    #[arg(long, default_value_t = 4)]
    pub system_prompts: u64,
    /// Generated workload: system prompt length, tokens.
    #[arg(long, default_value_t = 4096)]
    pub system_tokens: u32,
    /// Generated workload: user part of each prompt, tokens (uniform up to this).
    #[arg(long, default_value_t = 2048)]
    pub user_tokens: u32,
    /// Seed of the generated workload.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

/// What one workload cost, without and with the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saving {
    /// Lookups (requests with at least one full block).
    pub lookups: u64,
    /// Keys asked without the cache.
    pub keys_without: u64,
    /// Keys asked with the cache.
    pub keys_with: u64,
    /// `BatchExistKey` calls without the cache.
    pub calls_without: u64,
    /// `BatchExistKey` calls with the cache.
    pub calls_with: u64,
    /// Hit blocks, summed (equal with and without: checked).
    pub hit_blocks: u64,
}

/// Runs the task and prints one row per workload.
///
/// # Errors
/// A trace that cannot be read, or answers that differ with the cache (a bug).
pub fn run(args: &Args) -> anyhow::Result<()> {
    let mut traces = args.trace.clone();
    if traces.is_empty() {
        let shared = mooncake_peers::workspace_root().join("../shared/traces");
        for name in ["conversation_trace.jsonl", "synthetic_trace.jsonl"] {
            let path = shared.join(name);
            if path.is_file() {
                traces.push(path);
            }
        }
    }
    println!(
        "presence cache: lease {} s, max age {} s, result TTL {} s, block size {}, chunk {} keys",
        args.lease_s, args.max_age_s, args.result_ttl_s, args.block_size, args.chunk_keys
    );
    println!(
        "| workload | lookups | keys asked without | with cache | saved | calls without | with | hit blocks |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for path in &traces {
        let requests = load(path).with_context(|| format!("reading {}", path.display()))?;
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        row(&name, measure(&requests, args)?);
    }
    let generated = generate(args);
    row(
        &format!(
            "generated: {} system prompts of {} tokens, {} req/s",
            args.system_prompts, args.system_tokens, args.rate
        ),
        measure(&generated, args)?,
    );
    Ok(())
}

fn row(name: &str, s: Saving) {
    let saved = 1.0 - s.keys_with as f64 / s.keys_without.max(1) as f64;
    println!(
        "| {name} | {} | {} | {} | {:.1} % | {} | {} | {} |",
        s.lookups,
        s.keys_without,
        s.keys_with,
        saved * 100.0,
        s.calls_without,
        s.calls_with,
        s.hit_blocks
    );
}

/// A request stream with shared system prompts: Poisson arrivals at `rate`; each prompt
/// is one of `system_prompts` system prompts, then its own user tokens.
#[must_use]
pub fn generate(args: &Args) -> Vec<TraceRequest> {
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let system_blocks = args.system_tokens.div_ceil(TRACE_BLOCK_TOKENS) as u64;
    let mut next_id = args.system_prompts * system_blocks;
    let mut at_ms = 0.0f64;
    (0..args.requests)
        .map(|_| {
            at_ms += -rng.random_range(f64::EPSILON..1.0).ln() * 1000.0 / args.rate.max(1e-9);
            let system = rng.random_range(0..args.system_prompts.max(1));
            let user = rng.random_range(1..=args.user_tokens.max(1));
            let input_length = args.system_tokens + user;
            let mut hash_ids: Vec<u64> = (0..system_blocks)
                .map(|b| system * system_blocks + b)
                .collect();
            let total = input_length.div_ceil(TRACE_BLOCK_TOKENS) as u64;
            for _ in system_blocks..total {
                hash_ids.push(next_id);
                next_id += 1;
            }
            TraceRequest {
                timestamp: at_ms as u64,
                input_length,
                output_length: 1,
                hash_ids,
            }
        })
        .collect()
}

/// A lookup's keys: block `k` of the prompt is sub-block `k % per` of hash id
/// `k / per` (`per` vLLM blocks per 512-token trace block).
fn keys_of(req: &TraceRequest, block_size: u32) -> Vec<String> {
    let per = (TRACE_BLOCK_TOKENS / block_size.max(1)).max(1) as usize;
    let blocks = ((req.input_length / block_size.max(1)) as usize).min(req.hash_ids.len() * per);
    (0..blocks)
        .map(|k| format!("{:x}.{:x}", req.hash_ids[k / per], k % per))
        .collect()
}

/// The modelled store: sub-blocks written per hash id (written in order, no eviction).
#[derive(Default)]
struct Store {
    written: HashMap<u64, usize>,
}

impl Store {
    fn has(&self, key: &str) -> bool {
        let Some((id, sub)) = key.split_once('.') else {
            return false;
        };
        let (Ok(id), Ok(sub)) = (u64::from_str_radix(id, 16), usize::from_str_radix(sub, 16))
        else {
            return false;
        };
        self.written.get(&id).is_some_and(|&n| sub < n)
    }

    fn write(&mut self, req: &TraceRequest, block_size: u32) {
        let per = (TRACE_BLOCK_TOKENS / block_size.max(1)).max(1) as usize;
        let blocks =
            ((req.input_length / block_size.max(1)) as usize).min(req.hash_ids.len() * per);
        for (i, id) in req.hash_ids.iter().enumerate() {
            let subs = blocks.saturating_sub(i * per).min(per);
            let entry = self.written.entry(*id).or_default();
            *entry = (*entry).max(subs);
        }
    }
}

/// One lookup through the planner: (leading run, calls, keys asked), learned keys
/// inserted into `cache` when given.
fn lookup(
    keys: Vec<String>,
    store: &Store,
    chunk_keys: usize,
    cache: Option<(&mut PresenceCache, Instant, Duration, Duration)>,
) -> (usize, u64, u64) {
    let mut plan = LeadingRuns::new(chunk_keys);
    plan.add(keys, 1);
    let mut calls = 0;
    let (cache, now, keep, margin) = match cache {
        Some((c, now, keep, margin)) => (Some(c), now, keep, margin),
        None => (None, Instant::now(), Duration::ZERO, Duration::ZERO),
    };
    loop {
        let round = match cache.as_deref() {
            Some(c) => plan.next_round(&mut |k| c.is_present(k, now, margin)),
            None => plan.next_round(&mut |_| false),
        };
        let Some(round) = round else { break };
        for keys in round {
            calls += 1;
            let answers: Vec<_> = keys.iter().map(|k| Ok(store.has(k))).collect();
            // Lengths are equal by construction.
            let _ = plan.record(&keys, &answers);
        }
    }
    if let Some(c) = cache {
        for key in plan.present_keys() {
            c.insert(key, now + keep, now);
        }
    }
    let asked = plan.keys_asked();
    let run = plan.into_results().pop().and_then(Result::ok).unwrap_or(0);
    (run, calls, asked)
}

/// Replays `requests` (sorted by arrival) without and with the cache.
///
/// # Errors
/// When a lookup's answer differs with the cache (it must not).
pub fn measure(requests: &[TraceRequest], args: &Args) -> anyhow::Result<Saving> {
    let secs = |s: f64| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::ZERO);
    let keep = secs(args.lease_s).min(secs(args.max_age_s));
    let margin = secs(args.result_ttl_s);
    let origin = Instant::now();
    let mut store = Store::default();
    let mut cache = PresenceCache::new(1 << 22);
    let mut s = Saving::default();
    let mut order: Vec<&TraceRequest> = requests.iter().collect();
    order.sort_by_key(|r| r.timestamp);
    for req in order {
        let keys = keys_of(req, args.block_size);
        if !keys.is_empty() {
            let now = origin + Duration::from_millis(req.timestamp);
            let (run, calls, asked) = lookup(keys.clone(), &store, args.chunk_keys, None);
            let (run_c, calls_c, asked_c) = lookup(
                keys,
                &store,
                args.chunk_keys,
                Some((&mut cache, now, keep, margin)),
            );
            anyhow::ensure!(
                run == run_c,
                "the cache changed an answer: {run} != {run_c}"
            );
            s.lookups += 1;
            s.hit_blocks += run as u64;
            s.calls_without += calls;
            s.calls_with += calls_c;
            s.keys_without += asked;
            s.keys_with += asked_c;
        }
        store.write(req, args.block_size);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Args {
        Args {
            trace: Vec::new(),
            block_size: 16,
            chunk_keys: 1024,
            lease_s: 10.0,
            max_age_s: 10.0,
            result_ttl_s: 2.0,
            rate: 20.0,
            requests: 10,
            system_prompts: 1,
            system_tokens: 1024,
            user_tokens: 512,
            seed: 1,
        }
    }

    fn req(timestamp: u64, input_length: u32, hash_ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp,
            input_length,
            output_length: 1,
            hash_ids: hash_ids.to_vec(),
        }
    }

    #[test]
    fn a_prefix_seen_within_the_lease_less_the_ttl_is_not_asked_again() {
        // 2 trace blocks = 64 vLLM blocks each, all in one call. The first finds
        // nothing; the second (5 s) finds trace block 1 (32 keys, leased until 15 s);
        // the third (12 s, 12 + 2 < 15) takes them from the cache and then asks only
        // the next block (absent: the run ends there) instead of its 32-key window;
        // the fourth (22 s) is past the lease and asks everything again (a cached key
        // is not renewed).
        let reqs = [
            req(0, 1024, &[1, 2]),
            req(5_000, 1024, &[1, 3]),
            req(12_000, 1024, &[1, 4]),
            req(22_000, 1024, &[1, 5]),
        ];
        let s = measure(&reqs, &args()).unwrap();
        assert_eq!(s.lookups, 4);
        assert_eq!(s.keys_without, 256);
        assert_eq!(s.keys_with, 256 - 32 - 31);
        assert_eq!(s.hit_blocks, 96);
        assert_eq!((s.calls_without, s.calls_with), (4, 4));
    }

    #[test]
    fn the_generated_workload_shares_its_system_prompts() {
        let a = args();
        let reqs = generate(&a);
        assert_eq!(reqs.len(), 10);
        assert!(reqs.iter().all(|r| r.hash_ids[..2] == [0, 1]));
        assert!(reqs.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
    }
}
