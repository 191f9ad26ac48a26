//! Minimal sequences the property test found, and boundaries too rare to leave to
//! chance (a prefetch limit or `max_in_flight` of 16 reached, a 0 ns timeout, a
//! saturated deadline, writes that fail or come after the reply), replayed through
//! the same reference model and harness, one test each. Each also checks the model's
//! final state against values worked out by hand, so that the model cannot agree with
//! the core on a wrong answer.

use std::time::Duration;

use lookup_core::{Answer, Event, LookupOutcome, Probe, RequestId, RpcFailure, RpcId, Unavailable};
use proptest::test_runner::Config as ProptestConfig;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

use crate::machine::Model;
use crate::reference::RefState;
use crate::server::{Prompt, Shape};
use crate::settings::Settings;
use crate::sut::LookupTest;
use crate::transitions::{LocalHit, PromptChange, ReplyValue, Transition, WriteFailure};

/// Async lookup, no prefetch, sharing and priority on, one RPC on the wire at a time,
/// the spec's TTL and timeout, block size 16 with 8-byte hashes, writes at once.
pub(crate) fn settings() -> Settings {
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
        on_preemption: lookup_core::OnPreemption::Discard,
        preempted_wait_s: 5.0,
    }
}

pub(crate) fn prompt(num_tokens: u32, chain: u8) -> Prompt {
    Prompt {
        num_tokens,
        chain,
        hashed: true,
        extra_hashes: 0,
        skip: false,
    }
}

/// Runs `transitions` from a fresh state, checking after each step as the property
/// test does; returns the model's final state.
pub(crate) fn replay(settings: Settings, transitions: Vec<Transition>) -> RefState {
    let initial = RefState::new(settings);
    let mut state = initial.clone();
    for t in &transitions {
        assert!(
            Model::preconditions(&state, t),
            "scenario step {t:?} is not valid here"
        );
        state = Model::apply(state, t);
    }
    LookupTest::test_sequential(ProptestConfig::default(), initial, transitions, None);
    state
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

/// Statistics (per request, whether its lookup was ready at its first probe): the first probe of a request too short to look up answers `Ready(0)`; a
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

pub(crate) fn probe_new(slot: usize, prompt: Prompt) -> Transition {
    Transition::ProbeUnarrived {
        slot,
        prompt,
        local: LocalHit::Blocks { blocks: 0 },
    }
}

pub(crate) fn probe_again(slot: usize, local: LocalHit) -> Transition {
    Transition::Probe {
        slot,
        change: PromptChange::Same,
        local,
    }
}

pub(crate) fn answer_first(value: ReplyValue) -> Transition {
    Transition::Answer {
        wire_index: 0,
        value,
        duplicate: false,
    }
}

pub(crate) fn ready(external_tokens: u32) -> Option<Probe> {
    Some(Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    })
}

pub(crate) fn wire_ids(state: &RefState) -> Vec<RpcId> {
    state.wire.iter().map(|w| w.rpc_id).collect()
}

/// Rules 2-3 at a limit of 16: sixteen arrivals take every slot, the seventeenth is
/// refused; once a reply frees a slot, that request's second `on_new_request` takes it.
#[test]
fn a_prefetch_limit_of_16_binds_and_a_repeated_arrival_takes_a_freed_slot() {
    let settings = Settings {
        prefetch_limit: 16,
        share: false,
        pool: 17,
        ..settings()
    };
    let mut steps: Vec<Transition> = (0..17)
        .map(|slot| Transition::Arrive {
            slot,
            prompt: prompt(48, 0),
        })
        .collect();
    steps.push(answer_first(ReplyValue::Right));
    steps.push(Transition::Rearrive {
        slot: 16,
        change: PromptChange::Same,
    });
    let state = replay(settings, steps);
    assert_eq!(state.counters.lookups_arrival, 17);
    assert_eq!(state.counters.prefetch_cap_full, 1);
    assert_eq!(state.slots_in_use(), 16);
    assert_eq!(state.counters.rpcs_sent, 2);
    assert_eq!(wire_ids(&state), vec![RpcId(2)]);
}

/// `max_in_flight` 16: sixteen probe lookups go on the wire at once, the seventeenth
/// waits until a reply makes room.
#[test]
fn sixteen_rpcs_on_the_wire_and_the_seventeenth_waits_for_a_reply() {
    let settings = Settings {
        max_in_flight: 16,
        share: false,
        pool: 17,
        ..settings()
    };
    let mut steps: Vec<Transition> = (0..17).map(|slot| probe_new(slot, prompt(48, 0))).collect();
    steps.push(answer_first(ReplyValue::Right));
    let state = replay(settings, steps);
    assert_eq!(state.counters.lookups_probe, 17);
    assert_eq!(state.counters.first_probes_pending, 17);
    assert_eq!(state.counters.rpcs_sent, 17);
    assert_eq!(state.wire.len(), 16);
    assert_eq!(state.wire.last().map(|w| w.rpc_id), Some(RpcId(17)));
}

/// Rule 17 with `lookup_timeout_s` 1e-10 (0 ns): each RPC fails as it is released.
/// The probe that waited reads the failure once (rule 11), the next answers
/// "retrying" until the 10 ms backoff passed, then the retry fails the same way.
#[test]
fn a_timeout_of_0_ns_fails_each_rpc_as_it_is_released() {
    let settings = Settings {
        timeout_s: 1e-10,
        ..settings()
    };
    let local = LocalHit::Blocks { blocks: 0 };
    let state = replay(
        settings,
        vec![
            probe_new(0, prompt(48, 0)),
            probe_again(0, local),
            probe_again(0, local),
            Transition::Advance { ms: 10 },
            probe_again(0, local),
        ],
    );
    assert_eq!(state.expected.probe, Some(Probe::Pending));
    assert_eq!(
        state.expected.events,
        vec![Event::LookupDone {
            rpc_id: RpcId(2),
            outcome: LookupOutcome::Failed(RpcFailure::TimedOut),
            requests: 1,
            request_ids: vec![RequestId(0)],
            total: Duration::ZERO,
            queue_wait: Duration::ZERO,
            on_wire: Duration::ZERO,
        }]
    );
    assert_eq!(state.counters.rpcs_timed_out, 2);
    assert_eq!(state.counters.retries_after_failure, 1);
    assert_eq!(state.counters.answers_unavailable, 2);
    assert_eq!(
        state.answer_of(0),
        Some(Answer::Unavailable(Unavailable::Retrying))
    );
    assert_eq!(state.next_deadline(), None);
}

/// Configuration table: a timeout of 1e19 s is beyond every instant, so its deadline
/// saturates 30 years after the send and fires there; a TTL of `f64::MAX` keeps a
/// result valid across those 30 years.
#[test]
fn a_timeout_of_1e19_s_fires_30_years_ahead_and_a_huge_ttl_never_expires() {
    let settings = Settings {
        timeout_s: 1e19,
        ttl_s: f64::MAX,
        ..settings()
    };
    let thirty_years = Duration::from_secs(30 * 365 * 24 * 3600);
    let state = replay(
        settings.clone(),
        vec![
            probe_new(1, prompt(48, 0)),
            answer_first(ReplyValue::Right),
            probe_new(0, prompt(64, 3)),
        ],
    );
    assert_eq!(state.next_deadline(), Some(thirty_years.as_nanos()));
    let state = replay(
        settings,
        vec![
            probe_new(1, prompt(48, 0)),
            answer_first(ReplyValue::Right),
            probe_new(0, prompt(64, 3)),
            Transition::FireTimeout,
            probe_again(1, LocalHit::Blocks { blocks: 1 }),
        ],
    );
    assert_eq!(state.now_ns, thirty_years.as_nanos());
    assert_eq!(state.expected.probe, ready(16));
    assert_eq!(state.counters.failed_timed_out, 1);
    assert_eq!(state.counters.ttl_refreshes, 0);
    assert_eq!(state.counters.rpcs_created, 2);
}

/// A reply that arrives for a released RPC before the driver wrote it is applied (the
/// dispatcher holds it as on the wire); the write that follows is answered late.
#[test]
fn a_reply_before_the_write_is_applied_and_the_later_answer_is_late() {
    let settings = Settings {
        deferred_writes: true,
        ..settings()
    };
    let state = replay(
        settings,
        vec![
            probe_new(0, prompt(48, 0)),
            Transition::EarlyReply {
                index: 0,
                value: ReplyValue::Right,
            },
            Transition::Write { index: 0 },
            answer_first(ReplyValue::Right),
            probe_again(0, LocalHit::Blocks { blocks: 1 }),
        ],
    );
    assert_eq!(state.counters.hits, 1);
    assert_eq!(state.counters.late_replies, 1);
    assert_eq!(state.expected.probe, ready(16));
    assert!(state.unwritten.is_empty() && state.wire.is_empty());
}

/// A write that failed ends its lookup (rule 11: unavailable, not a miss) with the
/// reason the driver gave; only a transport failure counts as one on the wire.
#[test]
fn a_failed_write_fails_its_lookup_as_not_sent_or_transport() {
    let settings = Settings {
        deferred_writes: true,
        max_in_flight: 2,
        ..settings()
    };
    let local = LocalHit::Blocks { blocks: 0 };
    let state = replay(
        settings,
        vec![
            probe_new(0, prompt(48, 0)),
            probe_new(1, prompt(64, 1)),
            Transition::WriteFailed {
                index: 0,
                failure: WriteFailure::NotSent,
            },
            Transition::WriteFailed {
                index: 0,
                failure: WriteFailure::Transport,
            },
            probe_again(0, local),
            probe_again(1, local),
        ],
    );
    assert_eq!(state.counters.failed_transport, 2);
    assert_eq!(state.counters.rpcs_failed_transport, 1);
    assert_eq!(
        state.answer_of(0),
        Some(Answer::Unavailable(Unavailable::NotSent))
    );
    assert_eq!(
        state.answer_of(1),
        Some(Answer::Unavailable(Unavailable::Transport))
    );
}

/// `on_new_request` twice keeps the request's lookup, in flight or done; after its
/// allocation consumed it (rule 8), another `on_new_request` prefetches it again.
#[test]
fn a_repeated_arrival_keeps_its_lookup_and_after_allocation_prefetches_again() {
    let settings = Settings {
        prefetch_limit: 2,
        ..settings()
    };
    let again = Transition::Rearrive {
        slot: 0,
        change: PromptChange::Same,
    };
    let state = replay(
        settings,
        vec![
            Transition::Arrive {
                slot: 0,
                prompt: prompt(48, 0),
            },
            again.clone(),
            answer_first(ReplyValue::Right),
            again.clone(),
            Transition::Allocated { slot: 0 },
            again,
        ],
    );
    assert_eq!(state.counters.lookups_arrival, 2);
    assert_eq!(state.counters.rpcs_created, 2);
    assert_eq!(state.tracked_requests(), 1);
    assert_eq!(state.waiting_requests(), 1);
    assert_eq!(wire_ids(&state), vec![RpcId(2)]);
}

/// Block size 1 with 1-byte hashes: a 5-token prompt of chain 2 (its third block not
/// stored) hits 2 tokens; with a local hit of 1, one token is external.
#[test]
fn block_size_1_with_1_byte_hashes() {
    let settings = Settings {
        shape: Shape {
            block_size: 1,
            hash_len: 1,
        },
        ..settings()
    };
    let state = replay(
        settings,
        vec![
            probe_new(0, prompt(5, 2)),
            answer_first(ReplyValue::Right),
            probe_again(0, LocalHit::Blocks { blocks: 1 }),
        ],
    );
    assert_eq!(state.expected.probe, ready(1));
}

/// Block size 512 with 32-byte hashes and hash counts off the full blocks: 1,537
/// tokens with two hashes more than its 3 full blocks hit 1,536 (the server looks
/// only within the aligned prompt), less a local hit of 768 that is not
/// block-aligned; the same prompt with two hashes fewer asks another question (its
/// own RPC) and hits one block.
#[test]
fn block_size_512_with_32_byte_hashes_and_more_or_fewer_hashes() {
    let settings = Settings {
        shape: Shape {
            block_size: 512,
            hash_len: 32,
        },
        max_in_flight: 2,
        ..settings()
    };
    let more = Prompt {
        extra_hashes: 2,
        ..prompt(1537, 0)
    };
    let fewer = Prompt {
        extra_hashes: -2,
        ..more
    };
    let state = replay(
        settings.clone(),
        vec![
            probe_new(0, more),
            answer_first(ReplyValue::Right),
            probe_again(
                0,
                LocalHit::Unaligned {
                    blocks: 1,
                    tokens: 256,
                },
            ),
        ],
    );
    assert_eq!(state.expected.probe, ready(768));
    let state = replay(
        settings,
        vec![
            probe_new(0, more),
            probe_new(1, fewer),
            Transition::Answer {
                wire_index: 1,
                value: ReplyValue::Right,
                duplicate: false,
            },
            probe_again(1, LocalHit::Blocks { blocks: 0 }),
        ],
    );
    assert_eq!(state.counters.rpcs_created, 2);
    assert_eq!(state.expected.probe, ready(512));
}

/// Rule 7 for a prompt that shrinks (64 to 48 tokens): looked up again. A local hit
/// above rule 12's cap (`u32::MAX`) needs no RPC and leaves the waiting probe's reply
/// owed to the next probe (rule 6).
#[test]
fn a_shrunk_prompt_is_looked_up_again_and_a_local_hit_above_the_cap_asks_nothing() {
    let state = replay(
        settings(),
        vec![
            probe_new(0, prompt(64, 0)),
            answer_first(ReplyValue::Right),
            Transition::Probe {
                slot: 0,
                change: PromptChange::Shrink { tokens: 16 },
                local: LocalHit::Blocks { blocks: 0 },
            },
            answer_first(ReplyValue::Right),
            probe_again(0, LocalHit::AboveCap { tokens: u32::MAX }),
            probe_again(0, LocalHit::Blocks { blocks: 1 }),
        ],
    );
    assert_eq!(state.counters.chain_refreshes, 1);
    assert_eq!(state.counters.answers_not_needed, 1);
    assert_eq!(state.counters.rpcs_created, 2);
    assert_eq!(state.expected.probe, ready(16));
}
