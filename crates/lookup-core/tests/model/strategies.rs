//! Proptest strategies: configurations, prompts, and the next transition given the
//! reference state (so that generated indices are valid when generated).

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;

use crate::reference::RefState;
use crate::server::{CHAINS, MAX_EXTRA_HASHES, Prompt, Shape};
use crate::settings::Settings;
use crate::transitions::{
    DeadTarget, LocalHit, PromptChange, ReplyValue, Transition, WriteFailure,
};

/// Configurations of `spec/behaviour.md`'s table, varied across cases, each key over
/// its whole valid range: TTL from 0 and timeouts from below a nanosecond (0 ns once
/// converted) up to values beyond any instant (they saturate), exact in binary where
/// a boundary is hit; prefetch limits and `max_in_flight` up to 16; block sizes 1, 16
/// and 512 with hashes of 1, 8 and 32 bytes.
pub(crate) fn settings() -> impl Strategy<Value = Settings> {
    let lifecycle = (
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.85),
        any::<bool>(),
        select(vec![0u32, 1, 2, 3, 3, 8, 16]),
        prop_oneof![
            6 => select(vec![0.0, 0.25, 2.0]),
            1 => select(vec![1e-9, 1e6, 1e19, f64::MAX]),
        ],
        prop_oneof![
            6 => select(vec![0.25, 1.0, 5.0]),
            // 1e-10 s is 0 ns: each RPC fails as it is released.
            1 => select(vec![1e-10, 1e-9, 1e6, 1e19, f64::MAX]),
        ],
    );
    let wire = (
        any::<bool>(),
        any::<bool>(),
        select(vec![1u32, 1, 1, 2, 3, 16]),
        select(vec![1u32, 2, 65_536, 65_536]),
    );
    let harness = (
        select(vec![1u32, 16, 16, 512]),
        select(vec![1u16, 8, 8, 32]),
        select(vec![6usize, 6, 6, 6, 16]),
        prop::bool::weighted(0.2),
    );
    let preemption = (
        select(lookup_core::OnPreemption::ALL.to_vec()),
        select(vec![0.0, 0.05, 5.0]),
    );
    (lifecycle, wire, harness, preemption).prop_map(
        |(
            (enable_lookup, lookup_async, load_async, prefetch_limit, ttl_s, timeout_s),
            (share, priority, max_in_flight, max_queued),
            (block_size, hash_len, pool, deferred_writes),
            (on_preemption, preempted_wait_s),
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
            shape: Shape {
                block_size,
                hash_len,
            },
            pool,
            deferred_writes,
            on_preemption,
            preempted_wait_s,
        },
    )
}

/// Token offsets past a block boundary: 0, 1, half a block, a block less one.
fn offsets(b: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [0, 1, b / 2, b - 1]
        .into_iter()
        .filter(|o| *o < b)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// A prompt: a few lengths around block boundaries, few chains, sometimes fewer or
/// more hashes than full blocks, rarely no hashes or `skip_reading_external_kv`.
pub(crate) fn prompt(shape: Shape) -> impl Strategy<Value = Prompt> {
    let b = shape.block_size;
    let popular = select(vec![(3u32, 0u32, 0u8), (2, 1, 2), (4, 0, 1)])
        .prop_map(move |(blocks, offset, chain)| (blocks, offset.min(b - 1), chain));
    let any = (0..=5u32, select(offsets(b)), 0..CHAINS);
    let extra = prop_oneof![
        8 => Just(0i8),
        1 => -MAX_EXTRA_HASHES..=MAX_EXTRA_HASHES,
    ];
    (
        prop_oneof![2 => popular, 1 => any],
        prop::bool::weighted(0.95),
        extra,
        prop::bool::weighted(0.06),
    )
        .prop_map(
            move |((blocks, offset, chain), hashed, extra_hashes, skip)| Prompt {
                num_tokens: blocks * b + offset,
                chain,
                hashed,
                extra_hashes,
                skip,
            },
        )
}

fn change(shape: Shape) -> impl Strategy<Value = PromptChange> {
    let b = shape.block_size;
    prop_oneof![
        6 => Just(PromptChange::Same),
        2 => select(vec![1u32, (b / 2).max(1), b, 2 * b])
            .prop_map(|tokens| PromptChange::Grow { tokens }),
        1 => select(vec![1u32, b, 2 * b]).prop_map(|tokens| PromptChange::Shrink { tokens }),
        1 => (1..CHAINS).prop_map(|shift| PromptChange::Rechain { shift }),
    ]
}

fn local_hit(shape: Shape) -> impl Strategy<Value = LocalHit> {
    let b = shape.block_size;
    let unaligned = if b > 1 {
        offsets(b)[1..].to_vec()
    } else {
        vec![1]
    };
    prop_oneof![
        8 => select(vec![0u32, 0, 0, 1, 1, 2, 3, 4]).prop_map(|blocks| LocalHit::Blocks { blocks }),
        1 => (0..4u32, select(unaligned))
            .prop_map(|(blocks, tokens)| LocalHit::Unaligned { blocks, tokens }),
        1 => select(vec![1u32, b, u32::MAX]).prop_map(|tokens| LocalHit::AboveCap { tokens }),
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
        1 => Just(ReplyValue::StoreUnavailable),
        1 => any::<bool>().prop_map(|ok| ReplyValue::ResetReply { ok }),
    ]
}

/// The next transition, weighted: probes, arrivals and answers dominate; `Close` is
/// rare so that most cases run their whole length with the core open. Only arms whose
/// indices can be valid are offered (an answer needs an RPC on the wire, a write one
/// released and not written).
pub(crate) fn transition(state: &RefState) -> BoxedStrategy<Transition> {
    let shape = state.settings.shape;
    let pool = state.settings.pool;
    let live: Vec<usize> = (0..pool).filter(|s| state.requests[*s].is_some()).collect();
    let free: Vec<usize> = (0..pool).filter(|s| state.requests[*s].is_none()).collect();
    let wire = state.wire.len();
    let unwritten = state.unwritten.len();
    let ended = state.ended.len();

    let mut arms: Vec<(u32, BoxedStrategy<Transition>)> = Vec::new();
    if !free.is_empty() {
        // Parallel sampling: often the prompt of a live request (rule 16).
        let prompts: Vec<Prompt> = state.requests.iter().flatten().map(|r| r.prompt).collect();
        let prompt = if prompts.is_empty() {
            prompt(shape).boxed()
        } else {
            prop_oneof![2 => prompt(shape), 1 => select(prompts)].boxed()
        };
        let s = (select(free.clone()), prompt.clone())
            .prop_map(|(slot, prompt)| Transition::Arrive { slot, prompt });
        // A large pool fills up too, so that prefetch limits of 8 and 16 bind.
        arms.push((if pool > 6 { 160 } else { 70 }, s.boxed()));
        let s = (select(free), prompt, local_hit(shape)).prop_map(|(slot, prompt, local)| {
            Transition::ProbeUnarrived {
                slot,
                prompt,
                local,
            }
        });
        arms.push((5, s.boxed()));
    }
    if !live.is_empty() {
        let s = (select(live.clone()), change(shape), local_hit(shape)).prop_map(
            |(slot, change, local)| Transition::Probe {
                slot,
                change,
                local,
            },
        );
        arms.push((100, s.boxed()));
        let s = (select(live), change(shape))
            .prop_map(|(slot, change)| Transition::Rearrive { slot, change });
        arms.push((6, s.boxed()));
    }
    let any_slot = 0..pool;
    arms.push((
        15,
        any_slot
            .clone()
            .prop_map(|slot| Transition::Allocated { slot })
            .boxed(),
    ));
    arms.push((
        8,
        any_slot
            .clone()
            .prop_map(|slot| Transition::Preempted { slot })
            .boxed(),
    ));
    arms.push((
        25,
        any_slot
            .prop_map(|slot| Transition::Finished { slot })
            .boxed(),
    ));
    arms.push((6, Just(Transition::Reset).boxed()));
    arms.push((2, Just(Transition::Close).boxed()));
    // Around the TTLs and timeouts generated, 1e6 s (1e9 ms) included.
    let ms = select(vec![
        1u64,
        10,
        125,
        249,
        250,
        251,
        1000,
        2000,
        2001,
        5000,
        1_000_000_000,
    ]);
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
    if unwritten > 0 {
        let s = (0..unwritten).prop_map(|index| Transition::Write { index });
        arms.push((50, s.boxed()));
        let failure = prop_oneof![Just(WriteFailure::Transport), Just(WriteFailure::NotSent)];
        let s = (0..unwritten, failure)
            .prop_map(|(index, failure)| Transition::WriteFailed { index, failure });
        arms.push((8, s.boxed()));
        let s = (0..unwritten, reply_value())
            .prop_map(|(index, value)| Transition::EarlyReply { index, value });
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
    arms.push((3, Just(Transition::DropConnection).boxed()));
    arms.push((
        3,
        any::<bool>()
            .prop_map(|keep_reset| Transition::ReplaceConnection { keep_reset })
            .boxed(),
    ));
    Union::new_weighted(arms).boxed()
}
