//! Proptest strategies: configurations, prompts, and the next transition given the
//! reference state (so that generated indices are valid when generated).

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;

use crate::reference::{POOL, RefState, Settings};
use crate::server::{CHAINS, Prompt};
use crate::transitions::{DeadTarget, PromptChange, ReplyValue, Transition};

/// Configurations of `spec/behaviour.md`'s table, varied across cases. TTLs and
/// timeouts are exact in binary so that boundaries are hit exactly.
pub(crate) fn settings() -> impl Strategy<Value = Settings> {
    (
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.85),
        any::<bool>(),
        select(vec![0u32, 1, 2, 3, 3, 3]),
        select(vec![0.0, 0.25, 2.0]),
        select(vec![0.25, 1.0, 5.0]),
        any::<bool>(),
        any::<bool>(),
        select(vec![1u32, 1, 1, 2, 3]),
        select(vec![1u32, 2, 65_536, 65_536]),
    )
        .prop_map(
            |(
                enable_lookup,
                lookup_async,
                load_async,
                prefetch_limit,
                ttl_s,
                timeout_s,
                share,
                priority,
                max_in_flight,
                max_queued,
            )| Settings {
                enable_lookup,
                lookup_async,
                load_async,
                prefetch_limit,
                ttl_s,
                timeout_s,
                share,
                priority,
                max_in_flight,
                max_queued,
            },
        )
}

/// A prompt: a few lengths around block boundaries, few chains, rarely no hashes or
/// `skip_reading_external_kv`.
pub(crate) fn prompt() -> impl Strategy<Value = Prompt> {
    let popular = select(vec![(48u32, 0u8), (33, 2), (64, 1)]);
    let any = (
        select(vec![1u32, 8, 15, 16, 17, 31, 32, 33, 40, 48, 63, 64, 80]),
        0..CHAINS,
    );
    (
        prop_oneof![2 => popular, 1 => any],
        prop::bool::weighted(0.95),
        prop::bool::weighted(0.06),
    )
        .prop_map(|((num_tokens, chain), hashed, skip)| Prompt {
            num_tokens,
            chain,
            hashed,
            skip,
        })
}

fn change() -> impl Strategy<Value = PromptChange> {
    prop_oneof![
        6 => Just(PromptChange::Same),
        2 => select(vec![1u32, 8, 16, 32]).prop_map(|tokens| PromptChange::Grow { tokens }),
        1 => (1..CHAINS).prop_map(|shift| PromptChange::Rechain { shift }),
    ]
}

fn reply_value() -> impl Strategy<Value = ReplyValue> {
    prop_oneof![
        8 => Just(ReplyValue::Right),
        3 => (0..6u32).prop_map(|blocks| ReplyValue::Valid { blocks }),
        2 => Just(ReplyValue::FullPrompt),
        1 => Just(ReplyValue::TooHigh),
        1 => (0..6u32).prop_map(|blocks| ReplyValue::NotMultiple { blocks }),
        1 => Just(ReplyValue::Malformed),
        1 => any::<bool>().prop_map(|ok| ReplyValue::ResetReply { ok }),
    ]
}

/// The next transition, weighted: probes, arrivals and answers dominate; `Close` is
/// rare so that most cases run their whole length with the core open. Only arms whose
/// indices can be valid are offered (an answer needs an RPC on the wire).
pub(crate) fn transition(state: &RefState) -> BoxedStrategy<Transition> {
    let live: Vec<usize> = (0..POOL).filter(|s| state.requests[*s].is_some()).collect();
    let free: Vec<usize> = (0..POOL).filter(|s| state.requests[*s].is_none()).collect();
    let wire = state.wire.len();
    let ended = state.ended.len();

    let mut arms: Vec<(u32, BoxedStrategy<Transition>)> = Vec::new();
    if !free.is_empty() {
        // Parallel sampling: often the prompt of a live request (rule 16).
        let prompts: Vec<Prompt> = state.requests.iter().flatten().map(|r| r.prompt).collect();
        let prompt = if prompts.is_empty() {
            prompt().boxed()
        } else {
            prop_oneof![2 => prompt(), 1 => select(prompts)].boxed()
        };
        let s =
            (select(free), prompt).prop_map(|(slot, prompt)| Transition::Arrive { slot, prompt });
        arms.push((70, s.boxed()));
    }
    if !live.is_empty() {
        let s = (
            select(live),
            change(),
            select(vec![0u32, 0, 0, 1, 1, 2, 3, 4]),
        )
            .prop_map(|(slot, change, local_blocks)| Transition::Probe {
                slot,
                change,
                local_blocks,
            });
        arms.push((100, s.boxed()));
    }
    arms.push((
        15,
        (0..POOL)
            .prop_map(|slot| Transition::Allocated { slot })
            .boxed(),
    ));
    arms.push((
        8,
        (0..POOL)
            .prop_map(|slot| Transition::Preempted { slot })
            .boxed(),
    ));
    arms.push((
        25,
        (0..POOL)
            .prop_map(|slot| Transition::Finished { slot })
            .boxed(),
    ));
    arms.push((6, Just(Transition::Reset).boxed()));
    arms.push((2, Just(Transition::Close).boxed()));
    let ms = select(vec![1u64, 10, 125, 249, 250, 251, 1000, 2000, 2001, 5000]);
    arms.push((25, ms.prop_map(|ms| Transition::Advance { ms }).boxed()));
    arms.push((12, Just(Transition::FireTimeout).boxed()));
    if wire > 0 {
        let s = (0..wire, reply_value(), prop::bool::weighted(0.1)).prop_map(
            |(wire_index, value, duplicate)| Transition::Answer {
                wire_index,
                value,
                duplicate,
            },
        );
        arms.push((70, s.boxed()));
        let s = (0..wire).prop_map(|wire_index| Transition::TransportError { wire_index });
        arms.push((6, s.boxed()));
        let s = (0..wire).prop_map(|wire_index| Transition::Lose { wire_index });
        arms.push((6, s.boxed()));
    }
    let target = if ended > 0 {
        prop_oneof![
            4 => (0..ended).prop_map(DeadTarget::Ended),
            1 => Just(DeadTarget::Never),
        ]
        .boxed()
    } else {
        Just(DeadTarget::Never).boxed()
    };
    let s = (target, prop::option::weighted(0.8, reply_value()))
        .prop_map(|(target, value)| Transition::DeadReply { target, value });
    arms.push((6, s.boxed()));
    arms.push((3, Just(Transition::Reopen).boxed()));
    Union::new_weighted(arms).boxed()
}
