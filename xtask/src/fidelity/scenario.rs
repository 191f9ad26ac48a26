//! Scenarios for `cargo xtask fidelity --against vllm`: a trace slice turned into
//! the interchange format both schedulers read (`lookup_sim::engine::stepped`),
//! at one KV pressure and one connector answer.
//!
//! - Arrivals: the slice's timestamps divided into steps of `--ms-per-step`.
//! - Token ids: token `j` of the trace block with hash id `h` is a fixed function of
//!   `(h, j)`, so equal prefixes (equal ids at equal positions) give equal vLLM block
//!   hashes; tokens past the ids, and every output token, are unique to the request.
//! - KV pressure: `none` holds every request of the slice at once; `some` a sixth
//!   of that; `heavy` a sixteenth (never less than the largest request plus 16
//!   blocks), with outputs up to 4 times longer (with vLLM's full-prompt gate only
//!   growing decodes preempt).
//! - Connector: `missing` answers 0; `ready` answers, for every other request, its
//!   whole prompt's full trace blocks (stored by another engine before), and for
//!   the rest the leading trace blocks an earlier request of the slice shares, capped
//!   below the prompt; `pending` answers `None` for 1 to 3 probes first, then as
//!   `ready`; `load` and `pending-load` answer as `ready` and `pending`, and the
//!   external tokens load asynchronously (`load_kv_async`) for 1 to 4 steps.

use std::collections::HashSet;

use anyhow::bail;

use crate::simulate::engine::stepped::{ConnectorAnswer, Scenario, ScenarioRequest, Settings};
use crate::simulate::trace::{TRACE_BLOCK_TOKENS, TraceRequest};

/// How full the KV cache gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pressure {
    /// Every request fits at once: no preemption.
    None,
    /// A quarter of that.
    Some,
    /// A tenth of that, at least the largest request.
    Heavy,
}

/// What the stand-in connector answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Answers {
    /// The shared prefix, at every probe.
    Ready,
    /// `None` for 1-3 probes, then the shared prefix.
    Pending,
    /// Nothing stored.
    Missing,
    /// As `ready`, and loaded asynchronously (vLLM's `load_kv_async` True,
    /// `WAITING_FOR_REMOTE_KVS`) for 1 to 4 model-runner steps.
    Load,
    /// As `pending`, then loaded asynchronously as `load`.
    PendingLoad,
}

impl Pressure {
    /// Its name in the summary.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Some => "some",
            Self::Heavy => "heavy",
        }
    }
}

impl Answers {
    /// Its name in the summary.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Pending => "pending",
            Self::Missing => "missing",
            Self::Load => "load",
            Self::PendingLoad => "pending-load",
        }
    }
}

/// The scheduler settings of every scenario (vLLM's defaults for the OpenAI server,
/// block size 16).
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    /// Step length for arrivals (ms of trace time per step).
    pub ms_per_step: u64,
    /// Output tokens per request at most.
    pub max_output: u32,
    /// Token budget per step.
    pub max_num_batched_tokens: u32,
    /// Most running requests.
    pub max_num_seqs: u32,
    /// Steps at most.
    pub max_steps: u64,
    /// vLLM's full-prompt admission gate `scheduler_reserve_full_isl`.
    pub reserve_full_isl: bool,
    /// vLLM's `async_scheduling` (its `AsyncScheduler`, two batches in flight).
    pub async_scheduling: bool,
}

/// SplitMix64's finaliser: the token ids' source.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A token id in [0, 2^31).
fn token(x: u64) -> u32 {
    (mix(x) >> 33) as u32
}

/// The prompt's token ids of request `seq`.
#[must_use]
pub(super) fn prompt_tokens(r: &TraceRequest, seq: u64) -> Vec<u32> {
    (0..r.input_length)
        .map(|p| {
            let k = (p / TRACE_BLOCK_TOKENS) as usize;
            let j = u64::from(p % TRACE_BLOCK_TOKENS);
            match r.hash_ids.get(k) {
                Some(&h) => token(h.wrapping_mul(u64::from(TRACE_BLOCK_TOKENS)) + j),
                None => token((1 << 62) ^ (seq << 32) ^ u64::from(p)),
            }
        })
        .collect()
}

/// KV blocks of 16 tokens a request holds at its longest.
fn blocks(r: &TraceRequest, out: u32) -> u64 {
    u64::from(r.input_length + out - 1).div_ceil(16)
}

/// The scenario of `slice` at `pressure` with `answers`.
///
/// # Errors
/// An empty slice.
pub(super) fn build(
    slice: &[TraceRequest],
    pressure: Pressure,
    answers: Answers,
    shape: &Shape,
) -> anyhow::Result<Scenario> {
    let Some(first) = slice.first() else {
        bail!("an empty slice");
    };
    let t0 = first.timestamp;
    // Under heavy pressure outputs may run 4 times longer: with vLLM's full-prompt
    // gate only decodes growing past the free blocks preempt.
    let max_output = match pressure {
        Pressure::Heavy => shape.max_output.saturating_mul(4),
        _ => shape.max_output,
    };
    let out = |r: &TraceRequest| r.output_length.clamp(1, max_output);
    let total: u64 = slice.iter().map(|r| blocks(r, out(r))).sum();
    let largest = slice.iter().map(|r| blocks(r, out(r))).max().unwrap_or(1);
    let num_gpu_blocks = match pressure {
        Pressure::None => total + 16,
        Pressure::Some => (total / 6).max(largest + 16),
        Pressure::Heavy => (total / 16).max(largest + 16),
    };
    let mut seen: HashSet<(usize, u64)> = HashSet::new();
    let mut requests = Vec::with_capacity(slice.len());
    for (i, r) in slice.iter().enumerate() {
        let seq = i as u64;
        let full = r.full_blocks();
        let shared = (0..full)
            .take_while(|&k| seen.contains(&(k, r.hash_ids[k])))
            .count() as u32;
        for k in 0..full {
            seen.insert((k, r.hash_ids[k]));
        }
        let cap = (r.input_length - 1) / 16 * 16;
        // Every other request finds its whole prompt stored (written by another
        // engine before), the rest what the slice's earlier requests share.
        let stored = if i % 2 == 1 { full as u32 } else { shared };
        let hit_tokens = (stored * TRACE_BLOCK_TOKENS).min(cap);
        let pending_steps = 1 + (i as u32 % 3);
        let load_steps = Some(1 + (i as u32 % 4));
        let connector = match answers {
            Answers::Missing => ConnectorAnswer::Missing,
            Answers::Ready => ConnectorAnswer::Ready {
                hit_tokens,
                load_steps: None,
            },
            Answers::Pending => ConnectorAnswer::Pending {
                steps: pending_steps,
                hit_tokens,
                load_steps: None,
            },
            Answers::Load => ConnectorAnswer::Ready {
                hit_tokens,
                load_steps,
            },
            Answers::PendingLoad => ConnectorAnswer::Pending {
                steps: pending_steps,
                hit_tokens,
                load_steps,
            },
        };
        let outputs = out(r);
        requests.push(ScenarioRequest {
            request_id: format!("r{i}"),
            arrival_step: (r.timestamp - t0) / shape.ms_per_step.max(1),
            prompt_token_ids: prompt_tokens(r, seq),
            output_token_ids: (0..outputs)
                .map(|j| token((1 << 61) ^ (seq << 32) ^ u64::from(j)))
                .collect(),
            connector,
        });
    }
    Ok(Scenario {
        settings: Settings {
            block_size: 16,
            num_gpu_blocks,
            max_num_seqs: shape.max_num_seqs,
            max_num_batched_tokens: shape.max_num_batched_tokens,
            max_model_len: 131_072,
            enable_chunked_prefill: true,
            enable_prefix_caching: true,
            long_prefill_token_threshold: 0,
            async_scheduling: shape.async_scheduling,
            scheduler_reserve_full_isl: shape.reserve_full_isl,
            max_steps: shape.max_steps,
        },
        requests,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ts: u64, input: u32, ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp: ts,
            input_length: input,
            output_length: 3,
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn equal_prefixes_get_equal_tokens_and_the_store_answers_the_shared_prefix() {
        let slice = [req(100, 1200, &[7, 8, 9]), req(160, 1100, &[7, 8, 5])];
        let shape = Shape {
            ms_per_step: 20,
            max_output: 2,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            max_steps: 1000,
            reserve_full_isl: true,
            async_scheduling: true,
        };
        let sc = build(&slice, Pressure::None, Answers::Ready, &shape).unwrap();
        let (a, b) = (&sc.requests[0], &sc.requests[1]);
        assert_eq!(a.prompt_token_ids[..1024], b.prompt_token_ids[..1024]);
        assert_ne!(a.prompt_token_ids[1024], b.prompt_token_ids[1024]);
        assert_eq!(b.arrival_step, 3);
        assert_eq!(a.output_token_ids.len(), 2);
        assert_ne!(a.output_token_ids, b.output_token_ids);
        assert_eq!(
            a.connector,
            ConnectorAnswer::Ready {
                hit_tokens: 0,
                load_steps: None
            }
        );
        // The second request's whole prompt is stored: 2 full trace blocks.
        assert_eq!(
            b.connector,
            ConnectorAnswer::Ready {
                hit_tokens: 1024,
                load_steps: None
            }
        );
        // (1200 + 1) / 16 + (1100 + 1) / 16 rounded up, plus 16.
        assert_eq!(sc.settings.num_gpu_blocks, 76 + 69 + 16);
    }
}
