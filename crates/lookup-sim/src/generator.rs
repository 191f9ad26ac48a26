//! The embedded default trace: a seeded generator shaped like Mooncake's
//! `conversation_trace.jsonl` (one hour of production chat traffic, FAST'25 release).
//!
//! Only summary statistics of that trace are embedded (quantiles measured on its
//! 12,031 requests), never its records:
//!
//! - arrivals come in batches every 3 s (the trace has 1,180 distinct timestamps,
//!   2,997-3,003 ms apart) of Poisson size with mean 10.2 (observed: 2 to 28);
//! - every request starts with block id 0 (a shared system prompt);
//! - 38.7 % of requests continue an earlier request (share more than that first
//!   block): the earlier request is picked by how long ago it arrived (median 147 s),
//!   the follow-up reuses a leading part of its chain (median 92 % of it) and adds a
//!   few new blocks (median 2, 90th percentile 20);
//! - the others are new conversations (median 11 blocks, 90th percentile 50, max 247);
//! - output lengths: median 350 tokens, 99th percentile 1,120, max 2,000.

pub mod agent;

use std::collections::VecDeque;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::request::{TRACE_BLOCK_TOKENS, TraceRequest};

/// Milliseconds between arrival batches.
const BATCH_INTERVAL_MS: u64 = 3_000;
/// Mean requests per batch.
const BATCH_MEAN: f64 = 10.2;
/// Longest prompt of the trace, in blocks (126,195 tokens).
const MAX_BLOCKS: usize = 247;
/// Share of requests that continue an earlier one.
const FOLLOW_UP: f64 = 0.387;
/// Quantile points `(p, value)`.
type Quantiles = [(f64, f64); 8];
/// Blocks of a new conversation's prompt.
const NEW_BLOCKS: Quantiles = [
    (0.0, 2.0),
    (0.1, 2.0),
    (0.25, 3.0),
    (0.5, 11.0),
    (0.75, 26.0),
    (0.9, 50.0),
    (0.99, 176.0),
    (1.0, 247.0),
];
/// Seconds back to the request a follow-up continues.
const FOLLOW_UP_AGE_S: Quantiles = [
    (0.0, 0.5),
    (0.1, 48.0),
    (0.25, 75.0),
    (0.5, 147.0),
    (0.75, 318.0),
    (0.9, 552.0),
    (0.99, 1_791.0),
    (1.0, 3_210.0),
];
/// Reused blocks / blocks of the continued request.
const REUSED_OF_SOURCE: Quantiles = [
    (0.0, 0.01),
    (0.1, 0.37),
    (0.25, 0.75),
    (0.5, 0.92),
    (0.75, 0.96),
    (0.9, 0.98),
    (0.99, 1.0),
    (1.0, 1.0),
];
/// New blocks a follow-up adds after the reused part.
const FOLLOW_UP_NEW_BLOCKS: Quantiles = [
    (0.0, 0.0),
    (0.1, 1.0),
    (0.25, 2.0),
    (0.5, 2.0),
    (0.75, 7.0),
    (0.9, 20.0),
    (0.99, 53.0),
    (1.0, 186.0),
];
/// Output tokens.
const OUTPUT_TOKENS: Quantiles = [
    (0.0, 1.0),
    (0.1, 24.0),
    (0.25, 156.0),
    (0.5, 350.0),
    (0.75, 472.0),
    (0.9, 597.0),
    (0.99, 1_120.0),
    (1.0, 2_000.0),
];

/// Inverse-CDF sample from quantile points, interpolating linearly (or linearly in
/// the logarithm when `log`, for values spanning orders of magnitude).
fn sample(rng: &mut ChaCha8Rng, q: &Quantiles, log: bool) -> f64 {
    let u: f64 = rng.random();
    let i = q
        .iter()
        .rposition(|(p, _)| *p <= u)
        .unwrap_or(0)
        .min(q.len() - 2);
    let ((p0, v0), (p1, v1)) = (q[i], q[i + 1]);
    let w = if p1 > p0 { (u - p0) / (p1 - p0) } else { 0.0 };
    if log {
        (v0.ln() + w * (v1.ln() - v0.ln())).exp()
    } else {
        v0 + w * (v1 - v0)
    }
}

/// A Poisson sample (Knuth's method; fine for means around 10).
fn poisson(rng: &mut ChaCha8Rng, mean: f64) -> u32 {
    let limit = (-mean).exp();
    let mut k = 0;
    let mut p: f64 = rng.random();
    while p > limit {
        k += 1;
        p *= rng.random::<f64>();
    }
    k
}

/// Longest look-back of a follow-up (ms), above `FOLLOW_UP_AGE_S`'s maximum.
const MAX_AGE_MS: u64 = 3_300_000;

/// Generates `num_requests` requests shaped like the conversation trace (see the
/// module docs), deterministically from `seed`, into memory ([`Generator`] streams
/// the same requests).
#[must_use]
pub fn generate(seed: u64, num_requests: usize) -> Vec<TraceRequest> {
    Generator::new(seed, num_requests).collect()
}

/// The generated trace, one request at a time: timestamps are non-decreasing; every
/// request has at least 2 blocks (513 tokens) and one output token. What it holds is
/// the requests of the last `MAX_AGE_MS` (the ones a follow-up may continue), so
/// millions of requests stream in constant memory.
#[derive(Debug)]
pub struct Generator {
    rng: ChaCha8Rng,
    left: usize,
    /// Requests still to come in the current arrival batch.
    batch_left: u32,
    /// A batch was completed (its successor starts one interval later).
    started: bool,
    batch_at: u64,
    next_id: u64,
    /// Earlier requests a follow-up may continue: (timestamp, hash ids), in order.
    recent: VecDeque<(u64, Vec<u64>)>,
}

impl Generator {
    /// `num_requests` requests from `seed`.
    #[must_use]
    pub fn new(seed: u64, num_requests: usize) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            left: num_requests,
            batch_left: 0,
            started: false,
            batch_at: 0,
            next_id: 1,
            recent: VecDeque::new(),
        }
    }

    /// A follow-up's blocks: a leading part of the latest request that arrived at or
    /// before `target` ms, and a few new ones; `None` when there is none.
    fn follow_up(&mut self, target: u64) -> Option<Vec<u64>> {
        let idx = self.recent.partition_point(|(t, _)| *t <= target);
        let src = &self.recent.get(idx.checked_sub(1)?)?.1;
        let f = sample(&mut self.rng, &REUSED_OF_SOURCE, false);
        let k = ((src.len() as f64 * f).round() as usize).clamp(2.min(src.len()), src.len());
        let extra = sample(&mut self.rng, &FOLLOW_UP_NEW_BLOCKS, false).round() as usize;
        let n = (k + extra).clamp(2, MAX_BLOCKS.max(k));
        let mut ids = src[..k].to_vec();
        while ids.len() < n {
            ids.push(self.next_id);
            self.next_id += 1;
        }
        Some(ids)
    }
}

impl Iterator for Generator {
    type Item = TraceRequest;

    fn next(&mut self) -> Option<TraceRequest> {
        if self.left == 0 {
            return None;
        }
        if self.batch_left == 0 {
            if self.started {
                self.batch_at += BATCH_INTERVAL_MS - 3 + self.rng.random_range(0..=6);
            }
            self.started = true;
            self.batch_left = poisson(&mut self.rng, BATCH_MEAN).max(1);
            let cutoff = self.batch_at.saturating_sub(MAX_AGE_MS);
            while self.recent.len() >= 2 && self.recent[1].0 <= cutoff {
                self.recent.pop_front();
            }
        }
        self.batch_left -= 1;
        self.left -= 1;
        let mut hash_ids = None;
        if self.rng.random::<f64>() < FOLLOW_UP {
            let age_ms = (sample(&mut self.rng, &FOLLOW_UP_AGE_S, true) * 1_000.0) as u64;
            if let Some(target) = self.batch_at.checked_sub(age_ms) {
                hash_ids = self.follow_up(target);
            }
        }
        let hash_ids = hash_ids.unwrap_or_else(|| {
            let n = sample(&mut self.rng, &NEW_BLOCKS, true).round().max(2.0) as usize;
            let mut ids = vec![0];
            while ids.len() < n {
                ids.push(self.next_id);
                self.next_id += 1;
            }
            ids
        });
        let blocks = hash_ids.len() as u32;
        let tail = self.rng.random_range(1..=TRACE_BLOCK_TOKENS);
        let output_length = sample(&mut self.rng, &OUTPUT_TOKENS, false)
            .round()
            .max(1.0) as u32;
        self.recent.push_back((self.batch_at, hash_ids.clone()));
        Some(TraceRequest {
            timestamp: self.batch_at,
            input_length: (blocks - 1) * TRACE_BLOCK_TOKENS + tail,
            output_length,
            hash_ids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_trace_and_shape_holds() {
        let a = generate(7, 3_000);
        let b = generate(7, 3_000);
        assert_eq!(a, b);
        assert_ne!(a, generate(8, 3_000));
        assert_eq!(a.len(), 3_000);
        assert!(a.iter().all(|r| r.hash_ids[0] == 0));
        assert!(a.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
        assert!(
            a.iter()
                .all(|r| r.hash_ids.len() as u32 == r.input_length.div_ceil(512))
        );
        // Roughly the trace's rate: ~10.2 requests per 3 s.
        let span_s = a.last().unwrap().timestamp as f64 / 1_000.0;
        let rate = a.len() as f64 / span_s;
        assert!((2.9..4.0).contains(&rate), "rate {rate}");
        // Some requests reuse more than the shared first block.
        let mut seen = std::collections::HashSet::new();
        let mut reusing = 0;
        for r in &a {
            if r.hash_ids.len() > 1 && seen.contains(&r.hash_ids[1]) {
                reusing += 1;
            }
            seen.extend(r.hash_ids.iter().copied());
        }
        let share = f64::from(reusing) / a.len() as f64;
        assert!((0.25..0.45).contains(&share), "reusing share {share}");
    }

    /// The generator keeps only the last `MAX_AGE_MS` of requests; searching every
    /// earlier request, as it did when it built the whole trace in memory, gives the
    /// same trace.
    #[test]
    fn the_window_of_recent_requests_loses_nothing() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut all: Vec<TraceRequest> = Vec::new();
        let (mut next_id, mut batch_at) = (1, 0);
        while all.len() < 20_000 {
            for _ in 0..poisson(&mut rng, BATCH_MEAN).max(1) {
                if all.len() == 20_000 {
                    break;
                }
                let mut hash_ids = None;
                if rng.random::<f64>() < FOLLOW_UP {
                    let age_ms = (sample(&mut rng, &FOLLOW_UP_AGE_S, true) * 1_000.0) as u64;
                    if let Some(target) = u64::checked_sub(batch_at, age_ms) {
                        let idx = all.partition_point(|r| r.timestamp <= target);
                        if idx > 0 {
                            let src = &all[idx - 1].hash_ids;
                            let f = sample(&mut rng, &REUSED_OF_SOURCE, false);
                            let k = ((src.len() as f64 * f).round() as usize)
                                .clamp(2.min(src.len()), src.len());
                            let extra =
                                sample(&mut rng, &FOLLOW_UP_NEW_BLOCKS, false).round() as usize;
                            let n = (k + extra).clamp(2, MAX_BLOCKS.max(k));
                            let mut ids = src[..k].to_vec();
                            while ids.len() < n {
                                ids.push(next_id);
                                next_id += 1;
                            }
                            hash_ids = Some(ids);
                        }
                    }
                }
                let hash_ids = hash_ids.unwrap_or_else(|| {
                    let n = sample(&mut rng, &NEW_BLOCKS, true).round().max(2.0) as usize;
                    let mut ids = vec![0];
                    while ids.len() < n {
                        ids.push(next_id);
                        next_id += 1;
                    }
                    ids
                });
                let blocks = hash_ids.len() as u32;
                let tail = rng.random_range(1..=TRACE_BLOCK_TOKENS);
                let output_length = sample(&mut rng, &OUTPUT_TOKENS, false).round().max(1.0) as u32;
                all.push(TraceRequest {
                    timestamp: batch_at,
                    input_length: (blocks - 1) * TRACE_BLOCK_TOKENS + tail,
                    output_length,
                    hash_ids,
                });
            }
            batch_at += BATCH_INTERVAL_MS - 3 + rng.random_range(0..=6);
        }
        // 20,000 requests span ~1.6 hours, well beyond the 55-minute window.
        assert!(all.last().unwrap().timestamp > 3 * MAX_AGE_MS / 2);
        assert_eq!(generate(9, 20_000), all);
    }
}
