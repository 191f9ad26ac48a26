//! Named scenarios of a store and a connection that move, replayed through the
//! reference model and the harness like `model/scenarios.rs`: a reset is a barrier
//! whatever `max_in_flight` is (rule 13), a failed request's retry waits out the
//! backoff when its prompt changed (rule 11), and RPCs on a dropped or replaced
//! connection end by their timeout or at once (rule 17).

use lookup_core::{Answer, Probe, RpcId, Unavailable};

use crate::scenarios::{
    answer_first, probe_again, probe_new, prompt, ready, replay, settings, wire_ids,
};
use crate::settings::Settings;
use crate::transitions::{LocalHit, PromptChange, ReplyValue, Transition};

const NO_LOCAL: LocalHit = LocalHit::Blocks { blocks: 0 };

/// Rule 13 with `max_in_flight` 4: a lookup submitted after `reset()` waits for the
/// reset's reply, although the wire has room for it; a stale lookup on the wire
/// beside the reset is answered and ignored; the new one goes out only once the reset
/// is done, and its answer (from the store after the reset) is applied.
#[test]
fn a_lookup_after_reset_waits_for_the_reset_with_4_in_flight() {
    let settings = Settings {
        max_in_flight: 4,
        ..settings()
    };
    let state = replay(
        settings.clone(),
        vec![
            probe_new(0, prompt(48, 0)),
            Transition::Reset,
            probe_new(1, prompt(48, 2)),
        ],
    );
    // RPC 1 (before the reset) and the reset (2) are on the wire; 3 waits.
    assert_eq!(wire_ids(&state), vec![RpcId(1), RpcId(2)]);
    assert_eq!(state.expected.probe, Some(Probe::Pending));
    let state = replay(
        settings,
        vec![
            probe_new(0, prompt(48, 0)),
            Transition::Reset,
            probe_new(1, prompt(48, 2)),
            // The stale lookup's reply: nobody waits for it any more.
            answer_first(ReplyValue::Right),
            probe_again(1, NO_LOCAL),
            // The reset's reply lifts the barrier: RPC 3 goes out.
            answer_first(ReplyValue::Right),
            answer_first(ReplyValue::Right),
            probe_again(1, NO_LOCAL),
        ],
    );
    assert_eq!(state.counters.replies_stale, 1);
    assert_eq!(state.counters.rpcs_sent, 3);
    assert!(state.wire.is_empty());
    // Chain 2 stores its first two blocks of three: 32 hit tokens.
    assert_eq!(state.expected.probe, ready(32));
}

/// Rule 13 when the reset fails: the barrier holds until the reset times out, then
/// the lookup behind it goes out (the outcome says the store may not be reset).
#[test]
fn a_lookup_after_a_reset_that_times_out_goes_out_at_its_timeout() {
    let settings = Settings {
        max_in_flight: 4,
        ..settings()
    };
    let state = replay(
        settings,
        vec![
            Transition::Reset,
            probe_new(0, prompt(48, 0)),
            Transition::Lose { wire_index: 0 },
            Transition::Advance { ms: 4_999 },
        ],
    );
    assert!(
        state.wire.is_empty(),
        "the lookup waits behind the lost reset"
    );
    let state = replay(
        state.settings.clone(),
        vec![
            Transition::Reset,
            probe_new(0, prompt(48, 0)),
            Transition::Lose { wire_index: 0 },
            Transition::FireTimeout,
        ],
    );
    assert_eq!(wire_ids(&state), vec![RpcId(2)]);
    assert_eq!(state.counters.rpcs_timed_out, 1);
}

/// Rule 11 across a prompt change: a request whose lookup failed and whose prompt
/// then grew is not looked up again before the backoff passed (it answers
/// "retrying", no RPC); after it, the retry asks the new prompt, and a second failed
/// request waits while that retry is out (one at a time).
#[test]
fn a_failed_request_whose_prompt_changed_waits_out_the_backoff() {
    let grow = |slot| Transition::Probe {
        slot,
        change: PromptChange::Grow { tokens: 16 },
        local: NO_LOCAL,
    };
    let state = replay(
        settings(),
        vec![
            probe_new(0, prompt(48, 0)),
            Transition::TransportError { wire_index: 0 },
            probe_again(0, NO_LOCAL),
            grow(0),
        ],
    );
    assert_eq!(
        state.expected.probe,
        ready(0),
        "retrying, within the 10 ms backoff"
    );
    assert_eq!(
        state.answer_of(0),
        Some(Answer::Unavailable(Unavailable::Retrying))
    );
    assert_eq!(state.counters.rpcs_created, 1);
    assert_eq!(state.counters.chain_refreshes, 1);
    let state = replay(
        settings(),
        vec![
            probe_new(0, prompt(48, 0)),
            probe_new(1, prompt(48, 2)),
            Transition::TransportError { wire_index: 0 },
            Transition::TransportError { wire_index: 0 },
            probe_again(0, NO_LOCAL),
            probe_again(1, NO_LOCAL),
            Transition::Advance { ms: 1000 },
            grow(0),
            grow(1),
        ],
    );
    assert_eq!(state.counters.retries_after_failure, 1);
    assert_eq!(state.retrying, Some(3));
    assert_eq!(
        state.answer_of(1),
        Some(Answer::Unavailable(Unavailable::Retrying))
    );
    assert_eq!(wire_ids(&state), vec![RpcId(3)]);
}

/// Rule 11: a probe that needs nothing (its local hit reaches the cap) drops a failed
/// request's lookup of another prompt, but not its backoff: neither a later probe nor
/// a repeated arrival looks it up again before the backoff passed.
#[test]
fn a_failed_request_keeps_its_backoff_after_a_probe_that_needed_nothing() {
    let settings = Settings {
        prefetch_limit: 2,
        ..settings()
    };
    let state = replay(
        settings,
        vec![
            Transition::Arrive {
                slot: 0,
                prompt: prompt(48, 0),
            },
            Transition::TransportError { wire_index: 0 },
            Transition::Probe {
                slot: 0,
                change: PromptChange::Grow { tokens: 16 },
                local: LocalHit::Blocks { blocks: 3 },
            },
            Transition::Rearrive {
                slot: 0,
                change: PromptChange::Same,
            },
            probe_again(0, NO_LOCAL),
        ],
    );
    assert_eq!(state.counters.rpcs_created, 1);
    assert_eq!(
        state.answer_of(0),
        Some(Answer::Unavailable(Unavailable::Retrying))
    );
}

/// Rule 17 on a dropped connection: the RPCs written on it are lost without a word;
/// each fails at its own timeout, not later, and the one released after the drop is
/// answered.
#[test]
fn rpcs_on_a_dropped_connection_fail_at_their_timeout() {
    let settings = Settings {
        max_in_flight: 4,
        share: false,
        ..settings()
    };
    let state = replay(
        settings,
        vec![
            probe_new(0, prompt(48, 0)),
            Transition::Advance { ms: 1000 },
            probe_new(1, prompt(48, 2)),
            Transition::DropConnection,
            probe_new(2, prompt(48, 1)),
            Transition::FireTimeout,
        ],
    );
    assert_eq!(state.counters.rpcs_timed_out, 1);
    assert_eq!(state.now_ns, 5_000_000_000);
    assert_eq!(wire_ids(&state), vec![RpcId(3)]);
}

/// Rule 13 on a replaced connection: the reset kept for the new connection still holds
/// the barrier while the lookups of the old one fail at once; the lookup submitted
/// after the reset goes out once the new server answered it.
#[test]
fn a_reset_kept_across_a_replaced_connection_still_holds_the_barrier() {
    let settings = Settings {
        max_in_flight: 4,
        ..settings()
    };
    let state = replay(
        settings,
        vec![
            probe_new(0, prompt(48, 0)),
            Transition::Reset,
            probe_new(1, prompt(48, 2)),
            Transition::ReplaceConnection { keep_reset: true },
        ],
    );
    assert_eq!(wire_ids(&state), vec![RpcId(2)]);
    assert_eq!(state.counters.rpcs_failed_transport, 1);
    assert_eq!(state.counters.rpcs_sent, 2);
}
