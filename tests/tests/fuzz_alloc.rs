//! No unbounded allocation in the decoders (RELIABILITY.md): with dhat counting every
//! heap allocation of this process, each decode of a fuzz input allocates at most its
//! own size plus a small constant (an error message), and a length field claiming
//! gigabytes allocates nothing from the claim. Alone in its binary: dhat is the global
//! allocator here and counts the whole process.

use std::fmt::Debug;

use bytes::Bytes;
use lookup_core::wire::{self, Format, MAX_HASHES};
use lookup_tests::fuzz::{
    any_request, config, msgpack_request, reply_frames, size, tagged_request,
};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Random inputs per target (each decode is profiled, which is slow).
const INPUTS: u32 = 20_000;
/// Bytes a decode may allocate beyond its input: an error's message.
const SLACK: u64 = 256;

/// Bytes allocated while `f` runs (dropping its result outside the count).
fn allocated<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = dhat::HeapStats::get().total_bytes;
    let out = f();
    let after = dhat::HeapStats::get().total_bytes;
    (out, after - before)
}

/// Decodes `INPUTS` inputs of `strategy` with `decode`, asserting the bound on each;
/// returns the largest allocation seen beyond the input's size.
fn profile<S>(
    name: &str,
    runner: &mut TestRunner,
    strategy: S,
    decode: impl Fn(&[Bytes]) -> u64,
) -> i64
where
    S: Strategy<Value = Vec<Bytes>>,
    S::Value: Debug,
{
    let mut worst = i64::MIN;
    for _ in 0..INPUTS {
        let frames = strategy
            .new_tree(runner)
            .expect("a strategy without filters")
            .current();
        let input = size(&frames) as u64;
        let bytes = decode(&frames);
        assert!(
            bytes <= input + SLACK,
            "{name}: decoding {input} bytes allocated {bytes}: {frames:?}"
        );
        worst = worst.max(bytes as i64 - input as i64);
    }
    eprintln!("[{name}] {INPUTS} inputs: at most {worst} bytes allocated beyond the input's size");
    worst
}

#[test]
fn decoders_allocate_in_proportion_to_their_input_not_its_claims() {
    let _profiler = dhat::Profiler::builder().testing().build();

    // Claims of gigabytes: nothing is allocated from them.
    let tokens = Bytes::from_static(&[0, 0, 4, 0]);
    let crafted: Vec<(&str, Vec<Bytes>)> = vec![
        (
            "tagged-blob hash_len 65,535, no bytes",
            vec![
                Bytes::from_static(b"lookup"),
                tokens.clone(),
                Bytes::from_static(&[0xff, 0xff]),
                Bytes::new(),
            ],
        ),
        (
            "msgpack-hex array32 of 4 Gi hashes",
            vec![
                tokens.clone(),
                Bytes::from_static(&[0xdd, 0xff, 0xff, 0xff, 0xff]),
            ],
        ),
        (
            "msgpack-hex 65,535 hashes of 64 digits claimed, one sent",
            vec![tokens.clone(), {
                let mut v = vec![0xdc, 0xff, 0xff, 0xd9, 64];
                v.extend_from_slice(&[b'a'; 64]);
                Bytes::from(v)
            }],
        ),
        (
            "msgpack-hex str32 of 4 GiB",
            vec![
                tokens.clone(),
                Bytes::from_static(&[0x91, 0xdb, 0xff, 0xff, 0xff, 0xfe]),
            ],
        ),
    ];
    for (name, frames) in &crafted {
        let (request, bytes) = allocated(|| wire::decode_request(frames));
        eprintln!("[{name}] {bytes} bytes allocated: {request:?}");
        assert!(bytes <= SLACK, "{name}: {bytes} bytes allocated");
    }
    // A tagged-blob request over the count limit is refused without copying its
    // 64 KiB hash frame.
    let over = vec![
        Bytes::from_static(b"lookup"),
        tokens,
        Bytes::from_static(&[0, 1]),
        Bytes::from(vec![7; MAX_HASHES + 1]),
    ];
    let (_, bytes) = allocated(|| wire::decode_request(&over));
    assert!(
        bytes <= SLACK,
        "{bytes} bytes allocated for an over-limit count"
    );

    let mut runner = TestRunner::new(config(INPUTS));
    profile("reply decoders", &mut runner, reply_frames(), |frames| {
        let mut total = 0;
        for format in [Format::TaggedBlob, Format::MsgpackHex] {
            total += allocated(|| wire::decode_lookup_reply(format, frames)).1;
        }
        total + allocated(|| wire::decode_reset_reply(frames)).1
    });
    for (name, strategy) in [
        ("tagged-blob request decoder", tagged_request().boxed()),
        ("msgpack-hex request decoder", msgpack_request().boxed()),
        ("request classifier", any_request().boxed()),
    ] {
        profile(name, &mut runner, strategy, |frames| {
            allocated(|| wire::decode_request(frames)).1
        });
    }
}
