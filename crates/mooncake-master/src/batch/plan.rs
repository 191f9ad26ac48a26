//! [`LeadingRuns`]: the pure plan of one batched existence query for several lookups
//! at once (no I/O, no clock): which keys each `BatchExistKey` round asks, and each
//! lookup's leading run once the answers are in.
//!
//! The rules are those of [`MasterClient::leading_blocks_flat`](crate::MasterClient::leading_blocks_flat)
//! for one chain (`spec/wire.md`, "What the server computes", steps 2-3), applied to
//! several chains that may share keys (a system prompt, a continuation):
//!
//! - each round, every lookup whose run is still open contributes its *window*: the
//!   whole blocks after its last confirmed block, up to
//!   [`MasterConfig::chunk_keys`](crate::MasterConfig::chunk_keys) unknown keys (at
//!   least one block), ending before any block already known to hold an absent key;
//! - when that last confirmed block was taken from a presence cache, the window is
//!   that one next block (the *probe*): the cache holds what the master last answered
//!   present, so the block after a cached prefix is most often the one it answered
//!   absent, and asking the whole window would ask the absent tail again. A present
//!   probe opens the full window in the next round (one more round, the same answer);
//! - the round asks the union of the windows, each key once, in calls of at most
//!   `chunk_keys` keys;
//! - a lookup's run ends at its first block holding a key answered `false` or with an
//!   `ErrorCode` (the early stop: it asks nothing past it in later rounds).
//!
//! A single lookup with nothing taken from a cache is therefore asked exactly what
//! `leading_blocks_flat` asks: the same calls, the same keys, the same answer.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use crate::codec::ExistResult;
use crate::{MasterError, StoreErrorCode};

/// What is known about one key during a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    /// Present: answered `true` in this batch (`asked`), or known present beforehand
    /// (a presence cache).
    Present { asked: bool },
    /// Answered `false`.
    Absent,
    /// Answered with an application `ErrorCode` (counts as absent, vLLM counts only 1s).
    KeyError(StoreErrorCode),
    /// The call that asked it failed: index into [`LeadingRuns::failures`].
    Failed(usize),
}

/// One lookup of the batch.
#[derive(Debug)]
struct Run {
    keys: Vec<String>,
    keys_per_block: usize,
    /// Whole blocks in `keys` (a trailing partial block never counts).
    blocks: usize,
    /// Leading blocks confirmed present so far.
    present: usize,
    /// The answer, once known.
    done: Option<Result<usize, MasterError>>,
    /// A confirmed block rests on a key taken as present without asking.
    cached: bool,
    /// The answer was handed out by [`LeadingRuns::take_finished`].
    taken: bool,
}

/// The plan of one batched leading-run query over several lookups. Add the lookups with
/// [`add`](Self::add), then alternate [`next_round`](Self::next_round) (the calls to
/// make) and [`record`](Self::record) / [`record_failure`](Self::record_failure) (their
/// outcomes) until `next_round` returns `None`; [`into_results`](Self::into_results)
/// then gives each lookup its answer, in the order added.
#[derive(Debug)]
pub struct LeadingRuns {
    chunk_keys: usize,
    runs: Vec<Run>,
    known: HashMap<String, Known>,
    failures: Vec<MasterError>,
    keys_asked: u64,
    keys_wanted: u64,
    keys_assumed: u64,
}

impl LeadingRuns {
    /// An empty plan asking at most `chunk_keys` keys per call (0 is taken as 1).
    #[must_use]
    pub fn new(chunk_keys: usize) -> Self {
        Self {
            chunk_keys: chunk_keys.max(1),
            runs: Vec::new(),
            known: HashMap::new(),
            failures: Vec::new(),
            keys_asked: 0,
            keys_wanted: 0,
            keys_assumed: 0,
        }
    }

    /// Adds one lookup: `keys` laid out block-major, `keys_per_block` per block (one per
    /// rank namespace, as [`KeyLayout::chain_keys`](crate::KeyLayout::chain_keys) builds
    /// them). Returns its index among the results.
    ///
    /// `keys_per_block == 0` answers [`MasterError::InvalidConfig`], as
    /// `leading_blocks_flat` does; no keys answer `Ok(0)` at once.
    pub fn add(&mut self, keys: Vec<String>, keys_per_block: usize) -> usize {
        let (blocks, done) = match keys.len().checked_div(keys_per_block) {
            None => (
                0,
                Some(Err(MasterError::InvalidConfig {
                    what: "keys_per_block",
                    why: "must be at least 1".to_owned(),
                })),
            ),
            Some(blocks) => (blocks, (blocks == 0).then_some(Ok(0))),
        };
        self.runs.push(Run {
            keys,
            keys_per_block,
            blocks,
            present: 0,
            done,
            cached: false,
            taken: false,
        });
        self.runs.len() - 1
    }

    /// The number of lookups added.
    #[must_use]
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// Whether no lookup was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The keys of the next round, split into calls of at most `chunk_keys` keys, each
    /// key once; `None` once every lookup has its answer. `assume_present` is asked
    /// about keys not yet known in this batch: `true` makes the key present without
    /// asking (a presence cache backed by the master's read lease).
    pub fn next_round(
        &mut self,
        assume_present: &mut dyn FnMut(&str) -> bool,
    ) -> Option<Vec<Vec<String>>> {
        for i in 0..self.runs.len() {
            self.advance(i, assume_present);
        }
        let mut round: Vec<String> = Vec::new();
        let mut in_round: HashSet<&str> = HashSet::new();
        for run in &self.runs {
            if run.done.is_some() {
                continue;
            }
            // Right after a block resting on the cache, the cache holds what the
            // master last answered present: the next block is most likely the one it
            // answered absent, so one block is asked first, not the whole window.
            let probe = run.present > 0 && {
                let start = (run.present - 1) * run.keys_per_block;
                run.keys[start..start + run.keys_per_block]
                    .iter()
                    .any(|key| {
                        matches!(
                            self.known.get(key.as_str()),
                            Some(Known::Present { asked: false })
                        )
                    })
            };
            let mut budget = 0;
            for block in run.present..run.blocks {
                if probe && block > run.present {
                    break;
                }
                let start = block * run.keys_per_block;
                let keys = &run.keys[start..start + run.keys_per_block];
                let mut unknown = 0;
                let mut ends = false;
                for key in keys {
                    match self.known.get(key.as_str()) {
                        Some(Known::Absent | Known::KeyError(_)) => ends = true,
                        Some(_) => {}
                        None if assume_present(key) => {
                            self.keys_assumed += 1;
                            self.known
                                .insert(key.clone(), Known::Present { asked: false });
                        }
                        None => unknown += 1,
                    }
                }
                if ends || (block > run.present && budget + unknown > self.chunk_keys) {
                    break;
                }
                budget += unknown;
                for key in keys {
                    if !self.known.contains_key(key.as_str()) && in_round.insert(key.as_str()) {
                        round.push(key.clone());
                    }
                }
            }
            self.keys_wanted += budget as u64;
        }
        drop(in_round);
        if round.is_empty() {
            debug_assert!(self.runs.iter().all(|r| r.done.is_some()));
            return None;
        }
        self.keys_asked += round.len() as u64;
        let calls = round
            .chunks(self.chunk_keys)
            .map(<[String]>::to_vec)
            .collect();
        Some(calls)
    }

    /// Records the answers of one call of the round (`answers[i]` for `keys[i]`).
    ///
    /// # Errors
    /// [`MasterError::AnswerCount`] (and the keys count as failed) when the lengths
    /// differ.
    pub fn record(&mut self, keys: &[String], answers: &[ExistResult]) -> Result<(), MasterError> {
        if keys.len() != answers.len() {
            let error = MasterError::AnswerCount {
                expected: keys.len(),
                got: answers.len(),
            };
            self.record_failure(keys, error.clone());
            return Err(error);
        }
        for (key, answer) in keys.iter().zip(answers) {
            let known = match answer {
                Ok(true) => Known::Present { asked: true },
                Ok(false) => Known::Absent,
                Err(code) => Known::KeyError(*code),
            };
            self.known.insert(key.clone(), known);
        }
        Ok(())
    }

    /// Records that the call asking `keys` failed with `error`: every lookup whose run
    /// needs one of them fails with it.
    pub fn record_failure(&mut self, keys: &[String], error: MasterError) {
        let i = self.failures.len();
        self.failures.push(error);
        for key in keys {
            self.known.insert(key.clone(), Known::Failed(i));
        }
    }

    /// Keys answered `true` by the master in this batch (not those assumed present).
    pub fn present_keys(&self) -> impl Iterator<Item = &str> {
        self.known
            .iter()
            .filter(|(_, k)| matches!(k, Known::Present { asked: true }))
            .map(|(key, _)| key.as_str())
    }

    /// Keys sent to the master so far (each key once per batch).
    #[must_use]
    pub const fn keys_asked(&self) -> u64 {
        self.keys_asked
    }

    /// Keys the lookups' windows named so far, counted per lookup (what unbatched
    /// queries would have sent); `keys_wanted - keys_asked - keys_assumed` were saved
    /// by deduplication.
    #[must_use]
    pub const fn keys_wanted(&self) -> u64 {
        self.keys_wanted
    }

    /// Keys taken as present without asking (`assume_present` said yes).
    #[must_use]
    pub const fn keys_assumed(&self) -> u64 {
        self.keys_assumed
    }

    /// The lookups whose answer became known since the last call, each once: its
    /// index, its answer (as [`into_results`](Self::into_results) gives it) and whether
    /// the answer rests on a key taken as present without asking. Answers are known
    /// after [`next_round`](Self::next_round): a lookup whose run ended in one round
    /// is handed out before the next round is asked, whatever the others still need.
    pub fn take_finished(&mut self) -> Vec<(usize, Result<usize, MasterError>, bool)> {
        let mut out = Vec::new();
        for (i, run) in self.runs.iter_mut().enumerate() {
            if run.taken {
                continue;
            }
            if let Some(done) = &run.done {
                run.taken = true;
                out.push((i, done.clone(), run.cached));
            }
        }
        out
    }

    /// Each lookup's answer, in the order added: its leading run in blocks, or the
    /// error `leading_blocks_flat` would give (a `Store` error whose `key_index` counts
    /// the lookup's own keys block-major, or the failure of a call it needed).
    /// A lookup left open (the plan was not driven to the end) answers
    /// [`MasterError::Unavailable`].
    #[must_use]
    pub fn into_results(self) -> Vec<Result<usize, MasterError>> {
        self.runs
            .into_iter()
            .map(|run| {
                run.done.unwrap_or_else(|| {
                    Err(MasterError::Unavailable {
                        addr: String::new(),
                        last_error: "the batched query ended before this lookup's answer".into(),
                    })
                })
            })
            .collect()
    }

    /// Moves run `i` past every block known present; ends it when its answer is known.
    /// The keys lookup `i`'s confirmed blocks took as present without asking (from a
    /// presence cache): what its answer rests on beyond this batch's own answers.
    pub fn assumed_keys(&self, i: usize) -> impl Iterator<Item = &str> {
        let run = &self.runs[i];
        run.keys[..run.present * run.keys_per_block]
            .iter()
            .filter(|key| {
                matches!(
                    self.known.get(key.as_str()),
                    Some(Known::Present { asked: false })
                )
            })
            .map(String::as_str)
    }

    fn advance(&mut self, i: usize, assume_present: &mut dyn FnMut(&str) -> bool) {
        let run = &mut self.runs[i];
        if run.done.is_some() {
            return;
        }
        while run.present < run.blocks {
            let start = run.present * run.keys_per_block;
            let keys = &run.keys[start..start + run.keys_per_block];
            let mut unknown = false;
            let mut absent = false;
            let mut cached = false;
            let mut key_error = None;
            let mut failed = None;
            for (j, key) in keys.iter().enumerate() {
                let known = match self.known.entry(key.clone()) {
                    Entry::Occupied(e) => Some(*e.get()),
                    Entry::Vacant(e) => {
                        if assume_present(key) {
                            self.keys_assumed += 1;
                            Some(*e.insert(Known::Present { asked: false }))
                        } else {
                            None
                        }
                    }
                };
                match known {
                    Some(Known::Absent) => absent = true,
                    Some(Known::Present { asked }) => cached |= !asked,
                    Some(Known::KeyError(code)) => {
                        key_error = key_error.or(Some((start + j, code)));
                    }
                    Some(Known::Failed(f)) => failed = failed.or(Some(f)),
                    None => unknown = true,
                }
            }
            // A failed call decides the block before a `false` does: a failure never
            // reads as a miss, even when the block's keys went in several calls.
            if let Some(f) = failed {
                run.done = Some(Err(self.failures[f].clone()));
                return;
            }
            if absent {
                run.done = Some(Ok(run.present));
                return;
            }
            if unknown {
                break;
            }
            if let Some((index, code)) = key_error {
                run.done = Some(Err(MasterError::Store {
                    code,
                    key_index: Some(index),
                }));
                return;
            }
            run.present += 1;
            run.cached |= cached;
        }
        if run.present == run.blocks {
            run.done = Some(Ok(run.present));
        }
    }
}

#[cfg(test)]
mod tests;
