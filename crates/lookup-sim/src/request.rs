//! One request of a trace ([`TraceRequest`]) and the trace's block size: the record
//! the trace reader ([`crate::trace`]) and the embedded generator
//! ([`crate::generator`]) both produce, in a module of its own so that neither
//! depends on the other for it.

use serde::{Deserialize, Serialize};

/// Tokens covered by one trace hash id (the Mooncake traces' block size).
pub const TRACE_BLOCK_TOKENS: u32 = 512;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct TraceRequest {
    /// Arrival time, milliseconds from the start of the trace.
    pub timestamp: u64,
    /// Prompt length (tokens), at least 1.
    pub input_length: u32,
    /// Tokens to generate, at least 1 (the first one ends the prefill).
    pub output_length: u32,
    /// One id per 512-token prompt block, chained: equal ids at equal positions are a
    /// reusable prefix. The last id may cover a partial block; at most
    /// `ceil(input_length / 512)` ids.
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// Number of full 512-token prompt blocks that carry a hash id: the blocks a prefix
    /// cache can hold and the lookup asks about (vLLM hashes full blocks only).
    #[must_use]
    pub fn full_blocks(&self) -> usize {
        (self.input_length / TRACE_BLOCK_TOKENS).min(self.hash_ids.len() as u32) as usize
    }
}
