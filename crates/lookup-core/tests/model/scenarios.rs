//! Minimal sequences the property test found, replayed through the same reference
//! model and harness, one test each, so that a fix can be checked in isolation.

use proptest::test_runner::Config as ProptestConfig;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

use crate::machine::Model;
use crate::reference::RefState;
use crate::server::{Prompt, Shape};
use crate::settings::Settings;
use crate::sut::LookupTest;
use crate::transitions::{LocalHit, PromptChange, ReplyValue, Transition};

/// Async lookup, no prefetch, sharing and priority on, one RPC on the wire at a time,
/// the spec's TTL and timeout, block size 16 with 8-byte hashes, writes at once.
fn settings() -> Settings {
    Settings {
        enable_lookup: true,
        lookup_async: true,
        load_async: true,
        prefetch_limit: 0,
        ttl_s: 2.0,
        timeout_s: 5.0,
        share: true,
        priority: true,
        max_in_flight: 1,
        max_queued: 65_536,
        shape: Shape {
            block_size: 16,
            hash_len: 8,
        },
        pool: 6,
        deferred_writes: false,
    }
}

fn prompt(num_tokens: u32, chain: u8) -> Prompt {
    Prompt {
        num_tokens,
        chain,
        hashed: true,
        extra_hashes: 0,
        skip: false,
    }
}

/// Runs `transitions` from a fresh state, checking after each step as the property
/// test does.
fn replay(settings: Settings, transitions: Vec<Transition>) {
    let mut state = RefState::new(settings.clone());
    for t in &transitions {
        assert!(
            Model::preconditions(&state, t),
            "scenario step {t:?} is not valid here"
        );
        state = Model::apply(state, t);
    }
    LookupTest::test_sequential(
        ProptestConfig::default(),
        RefState::new(settings),
        transitions,
        None,
    );
}

/// Rule 13 with rule 16: after a reset, a lookup of the same prompt as an RPC sent
/// before the reset must not join that RPC (its reply describes the store before the
/// wipe and must be ignored): a new RPC is created.
#[test]
fn a_lookup_after_reset_does_not_join_an_rpc_sent_before_it() {
    let p = prompt(48, 0);
    replay(
        settings(),
        vec![
            Transition::Arrive { slot: 0, prompt: p },
            Transition::Probe {
                slot: 0,
                change: PromptChange::Same,
                local: LocalHit::Blocks { blocks: 0 },
            },
            Transition::Reset,
            Transition::Probe {
                slot: 0,
                change: PromptChange::Same,
                local: LocalHit::Blocks { blocks: 0 },
            },
            Transition::Answer {
                wire_index: 0,
                value: ReplyValue::Right,
                duplicate: false,
            },
            Transition::Probe {
                slot: 0,
                change: PromptChange::Same,
                local: LocalHit::Blocks { blocks: 0 },
            },
        ],
    );
}

/// Rule 7: a probe whose prompt changed drops the old lookup even when it answers
/// `Ready(0)` without an RPC (local hit at the cap): a queued prefetch of the old
/// prompt is cancelled and its slot freed (rules 3 and 9), never sent.
#[test]
fn a_ready_zero_probe_of_a_changed_prompt_drops_the_old_lookup() {
    let settings = Settings {
        prefetch_limit: 2,
        ..settings()
    };
    replay(
        settings,
        vec![
            Transition::Arrive {
                slot: 0,
                prompt: prompt(48, 0),
            },
            Transition::Arrive {
                slot: 1,
                prompt: prompt(33, 2),
            },
            Transition::Probe {
                slot: 1,
                change: PromptChange::Grow { tokens: 1 },
                local: LocalHit::Blocks { blocks: 2 },
            },
            Transition::Answer {
                wire_index: 0,
                value: ReplyValue::Right,
                duplicate: false,
            },
        ],
    );
}

/// Statistics (issue 2, "per request whether its lookup was ready at its first
/// probe"): the first probe of a request too short to look up answers `Ready(0)`; a
/// later probe after its prompt grew answers `Pending` but is not its first probe.
#[test]
fn the_first_probe_mark_records_the_first_probe() {
    replay(
        settings(),
        vec![
            Transition::Arrive {
                slot: 0,
                prompt: prompt(8, 0),
            },
            Transition::Probe {
                slot: 0,
                change: PromptChange::Same,
                local: LocalHit::Blocks { blocks: 0 },
            },
            Transition::Probe {
                slot: 0,
                change: PromptChange::Grow { tokens: 16 },
                local: LocalHit::Blocks { blocks: 0 },
            },
        ],
    );
}

/// Configuration table: `enable_lookup = false` means no RPC ever, a reset RPC
/// included.
#[test]
fn no_reset_rpc_with_lookup_disabled() {
    let settings = Settings {
        enable_lookup: false,
        ..settings()
    };
    replay(settings, vec![Transition::Reset]);
}
