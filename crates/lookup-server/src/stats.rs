//! What a server counts: the live atomic counters its socket task and request futures
//! bump, and the [`ServerStats`] snapshot read from them.

/// A snapshot of a server's counters since it was bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Messages received from the socket, whatever their content.
    pub requests: u64,
    /// Well-formed lookups, in either format.
    pub lookups: u64,
    /// Keys the index asked its store about in answered lookups
    /// ([`LeadingRun::keys_asked`](crate::LeadingRun::keys_asked), summed): blocks ×
    /// namespaces for the in-memory index; for the Mooncake index only the chunks
    /// sent, up to the one that ended the leading run. Failed index calls count none.
    pub keys_checked: u64,
    /// Hit tokens answered, summed (tokens).
    pub hit_tokens: u64,
    /// Malformed lookups, answered with hit 0 (`spec/wire.md`, "What the server
    /// computes").
    pub decode_errors: u64,
    /// Requests of neither format, answered with `0x00`.
    pub unknown_tags: u64,
    /// Messages without the empty delimiter frame, dropped unanswered: they cannot
    /// come from a REQ or well-behaved DEALER client, and have no routing envelope.
    pub no_delimiter: u64,
    /// Index calls that failed (or panicked, or answered the wrong number of flags);
    /// each such lookup was answered with the store-unavailable error reply
    /// (`spec/wire.md`, "Store unavailable").
    pub index_errors: u64,
    /// Reset requests received.
    pub resets: u64,
    /// Resets whose wipe failed, answered with `0x00`.
    pub reset_failures: u64,
    /// Replies handed to the socket.
    pub replies: u64,
    /// Receive or send errors of the socket.
    pub socket_errors: u64,
    /// Times the server stopped reading its socket because the bytes held for
    /// unanswered requests reached
    /// [`ServerConfig::max_pending_bytes`](crate::ServerConfig::max_pending_bytes).
    pub input_pauses: u64,
    /// The most bytes held for unanswered requests at once (frames and store keys,
    /// as [`ServerConfig::max_pending_bytes`](crate::ServerConfig::max_pending_bytes)
    /// counts them).
    pub pending_bytes_peak: u64,
}

mooncake_master::counters! {
    /// The live counters behind [`ServerStats`], one atomic per field of the same name,
    /// bumped by the socket task and the request futures (relaxed: each is a count on its
    /// own, read as a snapshot).
    pub(crate) struct ServerCounters => ServerStats {
        requests,
        lookups,
        keys_checked,
        hit_tokens,
        decode_errors,
        unknown_tags,
        no_delimiter,
        index_errors,
        resets,
        reset_failures,
        replies,
        socket_errors,
        input_pauses,
        pending_bytes_peak,
    }
}

pub(crate) use mooncake_master::counters::bump;

/// Whether the `count`-th occurrence of a kind of bad input gets a warning: the 1st,
/// 2nd, 4th, 8th, ... so that hostile input cannot flood the log.
pub(crate) fn worth_a_warning(count: u64) -> bool {
    count.is_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_thin_out() {
        let warned: Vec<u64> = (1..=20).filter(|&n| worth_a_warning(n)).collect();
        assert_eq!(warned, vec![1, 2, 4, 8, 16]);
    }
}
