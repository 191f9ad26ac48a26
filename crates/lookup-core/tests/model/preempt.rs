//! Rule 8's preemption policy (`lookup_on_preemption`) replayed through the reference
//! model and the harness, one named test per value, each checking the final state
//! against values worked out by hand: what a preempted request's probe answers, how
//! many RPCs it costs, and the wait budget the driver is given.

use lookup_core::OnPreemption;

use crate::reference::RefState;
use crate::scenarios::{answer_first, prompt, ready, replay, settings};
use crate::settings::Settings;
use crate::transitions::{LocalHit, PromptChange, ReplyValue, Transition};

/// `policy` with a 50 ms `lookup_preempted_wait_s`, the other settings the scenarios'.
fn with_policy(on_preemption: OnPreemption) -> Settings {
    Settings {
        on_preemption,
        preempted_wait_s: 0.05,
        ..settings()
    }
}

/// Request 0 arrives with a 48-token prompt of chain 0.
fn arrive() -> Transition {
    Transition::Arrive {
        slot: 0,
        prompt: prompt(48, 0),
    }
}

/// Request 0 is probed with its prompt unchanged and no local hit.
fn probe_same() -> Transition {
    Transition::Probe {
        slot: 0,
        change: PromptChange::Same,
        local: LocalHit::Blocks { blocks: 0 },
    }
}

/// Request 0 is probed with its prompt grown by 16 generated tokens (one block) and
/// `local_blocks` of it in the GPU's own cache.
fn probe_grown(local_blocks: u32) -> Transition {
    Transition::Probe {
        slot: 0,
        change: PromptChange::Grow { tokens: 16 },
        local: LocalHit::Blocks {
            blocks: local_blocks,
        },
    }
}

/// Arrival, a probe, and the server's right answer (32 tokens, the cap).
fn answered() -> Vec<Transition> {
    vec![arrive(), probe_same(), answer_first(ReplyValue::Right)]
}

/// [`answered`], then the probe that reads the answer.
fn answered_and_read() -> Vec<Transition> {
    let mut transitions = answered();
    transitions.push(probe_same());
    transitions
}

/// A 48-token prompt of chain 0 (every block stored: the server says 32, the cap)
/// is looked up and answered, allocated, then preempted after 16 generated tokens:
/// its prompt is now 64 tokens, the same chain one block longer. Returns the state
/// after the probe that follows the preemption, answered or not.
fn preempted_after_growth(policy: OnPreemption) -> RefState {
    replay(
        with_policy(policy),
        [
            answered_and_read(),
            vec![
                Transition::Allocated { slot: 0 },
                Transition::Preempted { slot: 0 },
                probe_grown(0),
            ],
        ]
        .concat(),
    )
}

/// `discard` (vLLM's): allocation consumed the result, so the probe after the
/// preemption looks the grown prompt up again and answers `Pending`; no wait budget.
#[test]
fn discard_looks_a_preempted_request_up_again() {
    let state = preempted_after_growth(OnPreemption::Discard);
    assert_eq!(state.expected.probe, Some(lookup_core::Probe::Pending));
    assert_eq!(state.counters.rpcs_created, 2);
    assert_eq!(state.counters.lookups_kept_on_preemption, 0);
    assert_eq!(state.wait_budget_ns(0), 0);
}

/// `wait`: the same new RPC, and the driver is told to wait 50 ms for its answer
/// until the request is allocated again.
#[test]
fn wait_gives_a_preempted_request_its_budget_until_allocated() {
    let state = preempted_after_growth(OnPreemption::Wait);
    assert_eq!(state.expected.probe, Some(lookup_core::Probe::Pending));
    assert_eq!(state.counters.rpcs_created, 2);
    assert_eq!(state.wait_budget_ns(0), 50_000_000);
    let mut after = state.clone();
    after.allocated(0);
    assert_eq!(after.wait_budget_ns(0), 0);
}

/// `keep` retains the result at allocation: the probe after the preemption reads it
/// for the prompt grown by one block (hit 32 of the 48-token lookup, local 0:
/// `Ready(32)`), with no second RPC.
#[test]
fn keep_retains_the_result_at_allocation_for_a_preemption() {
    for policy in [OnPreemption::Keep, OnPreemption::KeepWait] {
        let state = preempted_after_growth(policy);
        assert_eq!(state.expected.probe, ready(32), "{policy}");
        assert_eq!(state.counters.rpcs_created, 1, "{policy}");
        assert_eq!(state.counters.lookups_kept_on_preemption, 1, "{policy}");
    }
    assert_eq!(
        preempted_after_growth(OnPreemption::KeepWait).wait_budget_ns(0),
        50_000_000
    );
    assert_eq!(
        preempted_after_growth(OnPreemption::Keep).wait_budget_ns(0),
        0
    );
}

/// Without a preemption, a retained result is consumed as `discard` consumes it at
/// allocation: a reschedule after a failed load probes again and looks up again.
#[test]
fn keep_consumes_a_retained_result_at_a_probe_without_preemption() {
    let state = replay(
        with_policy(OnPreemption::Keep),
        [
            answered_and_read(),
            vec![Transition::Allocated { slot: 0 }, probe_same()],
        ]
        .concat(),
    );
    assert_eq!(state.expected.probe, Some(lookup_core::Probe::Pending));
    assert_eq!(state.counters.rpcs_created, 2);
    assert_eq!(state.counters.lookups_kept_on_preemption, 0);
}

/// A request preempted while its lookup is answered but not yet allocated (a running
/// request probed again after a failed load, or preempted in the step that probed
/// it): with `keep` the result answers the grown prompt, 32 tokens of the old 48-token
/// lookup, no second RPC; with `discard` it is looked up again.
fn preempted_before_allocation(policy: OnPreemption) -> RefState {
    replay(
        with_policy(policy),
        [
            answered(),
            vec![Transition::Preempted { slot: 0 }, probe_grown(1)],
        ]
        .concat(),
    )
}

#[test]
fn keep_answers_a_grown_prompt_from_the_kept_result() {
    for policy in [OnPreemption::Keep, OnPreemption::KeepWait] {
        let state = preempted_before_allocation(policy);
        // Hit 32 of the 48-token lookup, local 16: 16 to load; no refresh.
        assert_eq!(state.expected.probe, ready(16), "{policy}");
        assert_eq!(state.counters.rpcs_created, 1, "{policy}");
        assert_eq!(state.counters.chain_refreshes, 0, "{policy}");
        assert_eq!(state.counters.lookups_kept_on_preemption, 1, "{policy}");
    }
    assert_eq!(
        preempted_before_allocation(OnPreemption::KeepWait).wait_budget_ns(0),
        50_000_000
    );
    assert_eq!(
        preempted_before_allocation(OnPreemption::Keep).wait_budget_ns(0),
        0
    );
}

#[test]
fn discard_and_wait_look_a_grown_prompt_up_again() {
    for policy in [OnPreemption::Discard, OnPreemption::Wait] {
        let state = preempted_before_allocation(policy);
        assert_eq!(
            state.expected.probe,
            Some(lookup_core::Probe::Pending),
            "{policy}"
        );
        assert_eq!(state.counters.rpcs_created, 2, "{policy}");
        assert_eq!(state.counters.lookups_kept_on_preemption, 0, "{policy}");
    }
}

/// `keep` keeps the result only within its TTL (rule 6): 2.5 s after the reply, with
/// the spec's 2 s TTL, the preempted request is looked up again.
#[test]
fn keep_looks_up_again_once_the_kept_result_expired() {
    let state = replay(
        with_policy(OnPreemption::Keep),
        [
            answered_and_read(),
            vec![
                Transition::Preempted { slot: 0 },
                Transition::Advance { ms: 2_500 },
                probe_grown(0),
            ],
        ]
        .concat(),
    );
    assert_eq!(state.expected.probe, Some(lookup_core::Probe::Pending));
    assert_eq!(state.counters.rpcs_created, 2);
    assert_eq!(state.counters.ttl_refreshes, 1);
}

/// Sync mode never answers `Pending`, so no wait budget is given (rule 10), whatever
/// the policy.
#[test]
fn sync_mode_gives_no_wait_budget() {
    let settings = Settings {
        lookup_async: false,
        ..with_policy(OnPreemption::KeepWait)
    };
    let state = replay(
        settings,
        vec![arrive(), probe_same(), Transition::Preempted { slot: 0 }],
    );
    assert_eq!(state.wait_budget_ns(0), 0);
    assert_eq!(state.counters.lookups_kept_on_preemption, 1);
}
