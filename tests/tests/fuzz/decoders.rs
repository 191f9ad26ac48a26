//! Fuzzing the pure decoders of `lookup_core::wire` with proptest over arbitrary and
//! mutated bytes (RELIABILITY.md; nightly `cargo fuzz` is not available here):
//! 100,000 inputs per target, each compared with a reference decoder written from
//! `spec/wire.md` (`lookup_tests::fuzz`), so a case fails on any wrong answer, not only on
//! a panic. Targets: the client's reply decoders (lookup, both formats, and reset),
//! the server's request decoder for `tagged-blob` and for `msgpack-hex`, and the
//! request classifier on anything at all. Inputs are bounded (a few kilobytes); length
//! fields claiming gigabytes are crafted below and must be refused with their
//! specific error, before anything is allocated from them (allocation measured in
//! `fuzz_alloc.rs`).
//!
//! Seeded (`lookup_tests::fuzz::SEED`); `PROPTEST_RNG_SEED=<u64>` explores another stream.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use lookup_core::wire::{self, Format, MAX_HASH_LEN, MAX_HASHES, ServerRequest, WireError};
use lookup_tests::fuzz::{
    Kind, any_request, config, kind_of, msgpack_request, reference_kind, reference_lookup_reply,
    reference_msgpack_hashes, reference_reset_reply, reference_tagged, reply_frames,
    tagged_request,
};
use proptest::strategy::Strategy;
use proptest::test_runner::{TestCaseError, TestRunner};

/// Inputs per target.
const CASES: u32 = 100_000;

/// Runs `check` on `cases` inputs of `strategy`; `check` returns a label of what the
/// input was (counted and printed, to show which paths the inputs reached).
fn fuzz<S>(
    name: &str,
    strategy: S,
    check: impl Fn(&S::Value) -> Result<&'static str, TestCaseError>,
) -> BTreeMap<&'static str, u64>
where
    S: Strategy,
    S::Value: Debug,
{
    let config = config(CASES);
    let seed = config.rng_seed;
    let labels = Mutex::new(BTreeMap::new());
    let started = Instant::now();
    let result = TestRunner::new(config).run(&strategy, |input| {
        let label = check(&input)?;
        *labels.lock().expect("lock").entry(label).or_insert(0) += 1;
        Ok(())
    });
    if let Err(error) = result {
        panic!("{name}: {error} (seed {seed})");
    }
    let labels = labels.into_inner().expect("lock");
    let total: u64 = labels.values().sum();
    eprintln!(
        "[{name}] {total} inputs in {:?}, no panic, every answer as specified: {labels:?}",
        started.elapsed()
    );
    assert!(total >= u64::from(CASES), "{total} inputs");
    labels
}

#[test]
fn reply_decoders_on_arbitrary_bytes() {
    let labels = fuzz("reply decoders", reply_frames(), |frames| {
        for format in [Format::TaggedBlob, Format::MsgpackHex] {
            proptest::prop_assert_eq!(
                wire::decode_lookup_reply(format, frames),
                reference_lookup_reply(format, frames)
            );
        }
        let reset = wire::decode_reset_reply(frames);
        proptest::prop_assert_eq!(&reset, &reference_reset_reply(frames));
        Ok(
            match (wire::decode_lookup_reply(Format::TaggedBlob, frames), reset) {
                (Ok(reply), _) if !reply.boundaries.is_empty() => "lookup reply with boundaries",
                (Ok(_), _) => "plain lookup reply",
                (Err(_), Ok(_)) => "reset reply",
                (Err(_), Err(_)) => "malformed",
            },
        )
    });
    assert!(labels["lookup reply with boundaries"] > 1_000, "{labels:?}");
    assert!(labels["malformed"] > 1_000, "{labels:?}");
}

#[test]
fn tagged_blob_request_decoder_on_arbitrary_bytes() {
    let labels = fuzz("tagged-blob request decoder", tagged_request(), |frames| {
        let got = wire::decode_request(frames);
        proptest::prop_assert_eq!(&got, &reference_tagged(frames));
        Ok(match got {
            ServerRequest::Lookup { block_hashes, .. } if block_hashes.is_empty() => {
                "lookup without hashes"
            }
            ServerRequest::Lookup { .. } => "lookup",
            ServerRequest::Malformed {
                error: WireError::HashTooLong { .. },
                ..
            } => "hash_len above the limit",
            ServerRequest::Malformed { .. } => "other malformed",
            _ => "not a tagged lookup",
        })
    });
    assert!(labels["lookup"] > 10_000, "{labels:?}");
    assert!(labels["hash_len above the limit"] > 1_000, "{labels:?}");
    assert!(!labels.contains_key("not a tagged lookup"), "{labels:?}");
}

#[test]
fn msgpack_hex_request_decoder_on_arbitrary_bytes() {
    let labels = fuzz("msgpack-hex request decoder", msgpack_request(), |frames| {
        let got = wire::decode_request(frames);
        let tokens = u32::from_be_bytes(frames[0].as_ref().try_into().expect("4 bytes"));
        match (&got, reference_msgpack_hashes(&frames[1])) {
            (
                ServerRequest::Lookup {
                    format: Format::MsgpackHex,
                    num_tokens,
                    block_hashes,
                },
                Some(expected),
            ) => {
                proptest::prop_assert_eq!(*num_tokens, tokens);
                proptest::prop_assert_eq!(block_hashes, &expected);
                Ok(if expected.is_empty() {
                    "lookup without hashes"
                } else {
                    "lookup"
                })
            }
            (
                ServerRequest::Malformed {
                    format: Format::MsgpackHex,
                    error,
                },
                None,
            ) => Ok(match error {
                WireError::TooManyHashes { .. } => "count above the limit",
                WireError::Truncated { .. } => "claims beyond the frame",
                WireError::HashTooLong { .. } => "hash above the limit",
                _ => "other malformed",
            }),
            (got, expected) => Err(TestCaseError::fail(format!(
                "decoded {got:?}, the reference says {expected:?}"
            ))),
        }
    });
    assert!(labels["lookup"] > 5_000, "{labels:?}");
    assert!(labels["count above the limit"] > 1_000, "{labels:?}");
    assert!(labels["claims beyond the frame"] > 1_000, "{labels:?}");
}

#[test]
fn any_request_is_classified_as_documented() {
    let labels = fuzz("request classifier", any_request(), |frames| {
        let got = wire::decode_request(frames);
        let kind = reference_kind(frames);
        proptest::prop_assert_eq!(kind_of(&got), kind);
        if kind == Kind::Tagged {
            proptest::prop_assert_eq!(&got, &reference_tagged(frames));
        }
        Ok(match kind {
            Kind::Tagged => "tagged-blob",
            Kind::Msgpack => "msgpack-hex",
            Kind::Reset => "reset",
            Kind::Unknown => "unknown",
        })
    });
    assert_eq!(labels.len(), 4, "every kind reached: {labels:?}");
}

fn tagged(parts: [&[u8]; 4]) -> Vec<Bytes> {
    parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
}

fn msgpack(array: &[u8]) -> Vec<Bytes> {
    vec![
        Bytes::from_static(&[0, 0, 4, 0]),
        Bytes::copy_from_slice(array),
    ]
}

fn malformed(frames: &[Bytes]) -> WireError {
    match wire::decode_request(frames) {
        ServerRequest::Malformed { error, .. } => error,
        other => panic!("not malformed: {other:?}"),
    }
}

/// Length fields that claim gigabytes are refused with their own error, checked
/// against the limits and the bytes present before any buffer is sized from them.
#[test]
fn length_claims_of_gigabytes_are_refused() {
    let hex = [b'a'; 64];
    // tagged-blob: a 64 KiB hash claimed, no bytes sent.
    assert_eq!(
        malformed(&tagged([b"lookup", &[0, 0, 4, 0], &[0xff, 0xff], b""])),
        WireError::HashTooLong {
            len: 65_535,
            max: MAX_HASH_LEN
        }
    );
    // tagged-blob: the count comes from the bytes present, and is capped.
    assert_eq!(
        malformed(&tagged([
            b"lookup",
            &[0, 0, 4, 0],
            &[0, 1],
            &vec![7; MAX_HASHES + 1]
        ])),
        WireError::TooManyHashes {
            count: MAX_HASHES + 1,
            max: MAX_HASHES
        }
    );
    // msgpack-hex: an array32 claiming 4 Gi hashes in a 5-byte frame.
    assert_eq!(
        malformed(&msgpack(&[0xdd, 0xff, 0xff, 0xff, 0xff])),
        WireError::TooManyHashes {
            count: u32::MAX as usize,
            max: MAX_HASHES
        }
    );
    // msgpack-hex: 65,535 hashes of 64 digits claimed (4 MiB of digits), one sent.
    let mut frame = vec![0xdc, 0xff, 0xff, 0xd9, 64];
    frame.extend_from_slice(&hex);
    assert_eq!(
        malformed(&msgpack(&frame)),
        WireError::Truncated {
            needed: 64 + 65_534 * 65,
            available: 64
        }
    );
    // msgpack-hex: one str32 claiming 4 GiB of digits.
    assert_eq!(
        malformed(&msgpack(&[0x91, 0xdb, 0xff, 0xff, 0xff, 0xfe])),
        WireError::HashTooLong {
            len: 0x7fff_ffff,
            max: MAX_HASH_LEN
        }
    );
    assert_eq!(
        malformed(&msgpack(&[0x91, 0xdb, 0xff, 0xff, 0xff, 0xff])),
        WireError::BadHex { index: 0 }
    );
    // msgpack-hex: a str32 of a legal length claimed, with nothing after it.
    assert_eq!(
        malformed(&msgpack(&[0x91, 0xdb, 0x00, 0x00, 0x00, 0x40])),
        WireError::Truncated {
            needed: 64,
            available: 0
        }
    );
    // Replies carry no length field: their shape comes from the bytes received.
    assert_eq!(
        wire::decode_lookup_reply(Format::TaggedBlob, &[Bytes::from(vec![0xff; 11])]),
        Err(WireError::ReplyLength(11))
    );
}
