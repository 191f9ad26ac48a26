//! The engine's capacity levers, reported apart from the lookup settings: what twice
//! the GPU KV cache (an FP8 KV cache, or twice the memory) or another `max_num_seqs`
//! would buy at the recommended lookup setting. An operator buys these with
//! hardware or an engine setting, not with a lookup setting, so they never enter the
//! choice.

use serde::Serialize;

use super::setting::Setting;
use crate::engine::SimParams;
use crate::margin::Paired;
use crate::stability::Verdict;

/// The engine settings a capacity lever moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Capacity {
    /// The engines' `max_num_seqs`.
    pub max_num_seqs: u32,
    /// The engines' GPU KV capacity (16-token blocks per engine).
    pub gpu_kv_blocks: u64,
}

impl Capacity {
    /// The run's own.
    #[must_use]
    pub fn of(params: &SimParams) -> Self {
        Self {
            max_num_seqs: params.engine.max_num_seqs,
            gpu_kv_blocks: params.engine.gpu_kv_blocks,
        }
    }

    /// `base` with this capacity.
    #[must_use]
    pub fn apply(&self, base: &SimParams) -> SimParams {
        let mut p = base.clone();
        p.engine.max_num_seqs = self.max_num_seqs;
        p.engine.gpu_kv_blocks = self.gpu_kv_blocks;
        p
    }

    /// The levers tried around `base`: 2x the GPU KV blocks, then half and twice
    /// `max_num_seqs`, each with the other as given; a value equal to the run's is
    /// left out.
    #[must_use]
    pub fn levers(base: &SimParams) -> Vec<(String, Self)> {
        let own = Self::of(base);
        let mut out = Vec::new();
        let kv = own.gpu_kv_blocks.saturating_mul(2);
        if kv != own.gpu_kv_blocks {
            out.push((
                format!("2x GPU KV ({kv} blocks: an FP8 KV cache, or twice the memory)"),
                Self {
                    gpu_kv_blocks: kv,
                    ..own
                },
            ));
        }
        for seqs in [
            (own.max_num_seqs / 2).max(1),
            own.max_num_seqs.saturating_mul(2),
        ] {
            if seqs != own.max_num_seqs {
                out.push((
                    format!("max_num_seqs {seqs} (the run's {})", own.max_num_seqs),
                    Self {
                        max_num_seqs: seqs,
                        ..own
                    },
                ));
            }
        }
        out
    }
}

/// What one lever reported apart from the choice gave at the recommended setting, on
/// the fresh reruns: a capacity lever, or a lookup setting the vLLM connector does
/// not follow (`lookup_on_preemption = keep_wait`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Lever {
    /// The lever in words.
    pub lever: String,
    /// The lookup setting it ran with.
    pub setting: Setting,
    /// The engine settings it ran with.
    pub capacity: Capacity,
    /// Its reruns.
    pub verdict: Verdict,
    /// Its p99 over the recommended setting's at the run's capacity, rerun by rerun
    /// (below 1: the lever helps; `None`: not paired).
    pub ratio: Option<Paired>,
}
