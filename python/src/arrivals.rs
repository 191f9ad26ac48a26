//! `Arrivals`: the prefetches recorded under `set_defer_sends` and not applied yet.
//! Each arrival's hashes are copied when it is recorded (vLLM has just computed them:
//! they are in the cache) into one buffer that serves several steps; applying the
//! arrivals gives each its slice of it, so a step's arrivals share one allocation and
//! the client's own work for them runs once, together, at the step's first call.

use bytes::{Bytes, BytesMut};
use pyo3::prelude::*;

use crate::hashes::read_hashes;

/// Bytes the buffer reserves at a time when it runs out (a few steps' arrivals of
/// 64-block prompts): one allocation for several steps, not one each.
const CHUNK: usize = 64 * 1024;

/// One recorded arrival: caller id, `num_tokens`, and (hash length, bytes in the
/// buffer) or `None` when its hashes could not be read.
type Arrival = (String, u32, Option<(u16, usize)>);

/// The arrivals recorded, in order, and their hashes.
#[derive(Default)]
pub(crate) struct Arrivals {
    list: Vec<Arrival>,
    /// The hashes of `list`'s readable arrivals, in its order.
    hashes: BytesMut,
}

impl Arrivals {
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Records `req_id`'s arrival, its hashes copied now (an arrival whose hashes
    /// cannot be read is recorded without them, the buffer as it was).
    pub(crate) fn record(
        &mut self,
        req_id: String,
        num_tokens: u32,
        block_hashes: &Bound<'_, PyAny>,
    ) {
        if self.list.is_empty() {
            // No arrival owns a byte of the buffer now (each applied one took its
            // slice); cleared all the same, so that nothing left behind (a drain cut
            // short) could be read as this arrival's hashes.
            self.hashes.clear();
        }
        let need = block_hashes.len().unwrap_or(0) * 32;
        if self.hashes.capacity() - self.hashes.len() < need {
            self.hashes.reserve(need.max(CHUNK));
        }
        let start = self.hashes.len();
        let copied = read_hashes(&req_id, block_hashes, &mut self.hashes)
            .ok()
            .map(|hash_len| (hash_len, self.hashes.len() - start));
        self.list.push((req_id, num_tokens, copied));
    }

    /// `f` of each arrival, in order: caller id, `num_tokens`, and (hash length, its
    /// hashes) or `None` when they could not be read. Leaves none behind; the vector
    /// and the buffer's spare room are kept for the next arrivals.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&str, u32, Option<(u16, Bytes)>)) {
        for (req_id, num_tokens, copied) in self.list.drain(..) {
            let hashes =
                copied.map(|(hash_len, bytes)| (hash_len, self.hashes.split_to(bytes).freeze()));
            f(&req_id, num_tokens, hashes);
        }
    }

    /// Forgets every arrival (reset, close).
    pub(crate) fn clear(&mut self) {
        self.list.clear();
        self.hashes.clear();
    }
}
