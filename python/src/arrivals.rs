//! `Arrivals`: the prefetches recorded under `set_defer_sends` and not applied yet.
//! Each arrival's hashes are copied when it is recorded (vLLM has just computed them:
//! they are in the cache), into the client's `HashArena`; applying the arrivals hands
//! each its request, so the client's own work for a step's arrivals runs once,
//! together, at the step's first call.

use bytes::Bytes;

/// One recorded arrival: caller id, `num_tokens`, and (hash length, its hashes) or
/// `None` when its hashes could not be read.
type Arrival = (String, u32, Option<(u16, Bytes)>);

/// The arrivals recorded, in order.
#[derive(Default)]
pub(crate) struct Arrivals {
    list: Vec<Arrival>,
}

impl Arrivals {
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Records `req_id`'s arrival with its hashes (`None`: they could not be read).
    pub(crate) fn record(&mut self, req_id: String, num_tokens: u32, hashes: Option<(u16, Bytes)>) {
        self.list.push((req_id, num_tokens, hashes));
    }

    /// `f` of each arrival, in order: caller id, `num_tokens`, and (hash length, its
    /// hashes) or `None` when they could not be read. Leaves none behind; the vector
    /// is kept for the next arrivals.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&str, u32, Option<(u16, Bytes)>)) {
        for (req_id, num_tokens, hashes) in self.list.drain(..) {
            f(&req_id, num_tokens, hashes);
        }
    }

    /// Forgets every arrival (reset, close).
    pub(crate) fn clear(&mut self) {
        self.list.clear();
    }
}
