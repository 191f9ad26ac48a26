//! A generated agent-shaped trace, in the Mooncake trace format (`timestamp`,
//! `input_length`, `output_length`, `hash_ids` of 512-token blocks). It is
//! generated, not a real trace: no tool or agent trace is published in that format,
//! and this one stands in for one, with the shape an agent loop gives a prefix
//! cache:
//!
//! - sessions start as a Poisson process (mean [`SESSION_GAP_MS`] apart); each picks
//!   one of [`SYSTEM_PROMPTS`] shared system prompts (a fixed chain of 2 to 7
//!   blocks) and adds a task of 2 to 5 blocks of its own;
//! - a session runs 2 to 12 turns; turn `i + 1`'s prompt is turn `i`'s prompt, its
//!   output and a tool result (200 to 4,000 tokens), so it shares every full block
//!   of turn `i`'s prompt, and the block holding turn `i`'s last tokens onwards are
//!   new (their tokens changed);
//! - outputs are short (a tool call: 10 to 300 tokens, log-uniform, median about 55);
//! - turn `i + 1` arrives 1 to 8 s after turn `i` (the model's answer and the tool's
//!   run, open loop: the trace does not wait for the engine).
//!
//! Deterministic from its seed; requests come out in timestamp order, holding only
//! the sessions still running.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::request::{TRACE_BLOCK_TOKENS, TraceRequest};

/// Shared system prompts sessions pick from.
pub const SYSTEM_PROMPTS: usize = 4;
/// Mean milliseconds between session starts.
pub const SESSION_GAP_MS: f64 = 1_500.0;
/// Longest prompt (blocks): a session stops growing past it (64k tokens).
const MAX_BLOCKS: u32 = 128;

/// A session between turns: its next turn's time and what it holds so far.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Session {
    /// The next turn's arrival (ms).
    at: u64,
    /// Its start order (ties on `at` break by it, so the order is deterministic).
    order: u64,
    /// Turns left, the next one included.
    turns_left: u32,
    /// The previous turn's prompt (tokens) and output (tokens): the next prompt
    /// extends both.
    prompt: u32,
    output: u32,
    /// Block ids of the previous prompt.
    hash_ids: Vec<u64>,
}

/// The agent-shaped trace (see the module docs), one request at a time.
#[derive(Debug)]
pub struct AgentGenerator {
    rng: ChaCha8Rng,
    left: usize,
    /// Sessions waiting for their next turn, earliest first.
    sessions: BinaryHeap<Reverse<Session>>,
    /// When the next session starts (ms).
    next_start: u64,
    started: u64,
    next_id: u64,
    /// The system prompts' block ids.
    system: Vec<Vec<u64>>,
}

/// Generates `num_requests` agent-shaped requests from `seed` into memory
/// ([`AgentGenerator`] streams the same).
#[must_use]
pub fn generate_agent(seed: u64, num_requests: usize) -> Vec<TraceRequest> {
    AgentGenerator::new(seed, num_requests).collect()
}

impl AgentGenerator {
    /// `num_requests` requests from `seed`.
    #[must_use]
    pub fn new(seed: u64, num_requests: usize) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut next_id = 1;
        let system = (0..SYSTEM_PROMPTS)
            .map(|_| {
                let n = rng.random_range(2..=7);
                (0..n)
                    .map(|_| {
                        next_id += 1;
                        next_id - 1
                    })
                    .collect()
            })
            .collect();
        Self {
            rng,
            left: num_requests,
            sessions: BinaryHeap::new(),
            next_start: 0,
            started: 0,
            next_id,
            system,
        }
    }

    fn fresh_ids(&mut self, n: u32) -> impl Iterator<Item = u64> + use<> {
        let first = self.next_id;
        self.next_id += u64::from(n);
        first..first + u64::from(n)
    }

    /// A new session's first turn, due at `next_start`.
    fn start_session(&mut self) -> Session {
        let at = self.next_start;
        let u: f64 = self.rng.random();
        self.next_start += (-(1.0 - u).ln() * SESSION_GAP_MS).round() as u64;
        let which = self.rng.random_range(0..SYSTEM_PROMPTS);
        let task = self.rng.random_range(2..=5);
        let mut hash_ids = self.system[which].clone();
        hash_ids.extend(self.fresh_ids(task));
        let blocks = hash_ids.len() as u32;
        let tail = self.rng.random_range(1..=TRACE_BLOCK_TOKENS);
        self.started += 1;
        Session {
            at,
            order: self.started,
            turns_left: self.rng.random_range(2..=12),
            prompt: (blocks - 1) * TRACE_BLOCK_TOKENS + tail,
            output: 0,
            hash_ids,
        }
    }

    /// A tool call's length (tokens): 10 to 300, log-uniform (median about 55).
    fn output_tokens(&mut self) -> u32 {
        let u: f64 = self.rng.random();
        (10.0 * 30f64.powf(u)).round() as u32
    }
}

impl Iterator for AgentGenerator {
    type Item = TraceRequest;

    fn next(&mut self) -> Option<TraceRequest> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let due = self.sessions.peek().map(|Reverse(s)| s.at);
        let mut s = match due {
            Some(at) if at <= self.next_start => self.sessions.pop().expect("peeked").0,
            _ => self.start_session(),
        };
        if s.output > 0 {
            // The next turn: the previous prompt, its output and a tool result. Full
            // blocks of the previous prompt are kept; the rest is new.
            let tool = self.rng.random_range(200..=4_000);
            let keep = (s.prompt / TRACE_BLOCK_TOKENS) as usize;
            let grown = (s.prompt + s.output + tool).min(MAX_BLOCKS * TRACE_BLOCK_TOKENS);
            s.prompt = grown.max(s.prompt);
            s.hash_ids.truncate(keep);
            let more = s.prompt.div_ceil(TRACE_BLOCK_TOKENS) - keep as u32;
            s.hash_ids.extend(self.fresh_ids(more));
        }
        s.output = self.output_tokens();
        let req = TraceRequest {
            timestamp: s.at,
            input_length: s.prompt,
            output_length: s.output,
            hash_ids: s.hash_ids.clone(),
        };
        s.turns_left -= 1;
        if s.turns_left > 0 && s.prompt < MAX_BLOCKS * TRACE_BLOCK_TOKENS {
            s.at += self.rng.random_range(1_000..=8_000);
            self.sessions.push(Reverse(s));
        }
        Some(req)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Seeded and deterministic; in timestamp order; in the trace format's bounds.
    #[test]
    fn same_seed_same_trace_in_order_and_in_format() {
        let a = generate_agent(3, 500);
        assert_eq!(a, generate_agent(3, 500));
        assert_ne!(a, generate_agent(4, 500));
        assert_eq!(a.len(), 500);
        assert!(a.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
        for r in &a {
            assert_eq!(r.hash_ids.len() as u32, r.input_length.div_ceil(512));
            assert!((10..=300).contains(&r.output_length), "{}", r.output_length);
        }
    }

    /// Every turn after a session's first extends a previous request: it shares all
    /// of that request's full blocks and grows by its output and a tool result, so
    /// the prefix caches see long shared prefixes; sessions share system prompts.
    #[test]
    fn a_turn_extends_the_previous_turn_of_its_session() {
        let a = generate_agent(5, 400);
        // The request whose prompt's full blocks a later one extends, by its chain.
        let mut by_full: HashMap<Vec<u64>, &TraceRequest> = HashMap::new();
        let mut extending = 0;
        for r in &a {
            let found = (1..=r.hash_ids.len())
                .rev()
                .find_map(|n| by_full.get(&r.hash_ids[..n]).map(|p| (n, *p)));
            if let Some((n, prev)) = found
                && n == (prev.input_length / 512) as usize
                && n > 0
            {
                assert!(r.input_length >= prev.input_length + prev.output_length + 200);
                extending += 1;
            }
            by_full.insert(r.hash_ids[..(r.input_length / 512) as usize].to_vec(), r);
        }
        assert!(extending > 250, "{extending} of 400 extend a previous turn");
        let firsts: std::collections::HashSet<u64> = a.iter().map(|r| r.hash_ids[0]).collect();
        assert!(firsts.len() <= SYSTEM_PROMPTS, "{firsts:?}");
    }
}
