//! Input strategies: arbitrary bytes mixed with mutated valid messages of both wire
//! formats, all bounded in size.

use bytes::Bytes;
use lookup_core::BlockHashes;
use lookup_core::wire::{self, Format, MAX_HASH_LEN};
use proptest::prelude::*;

use super::*;

/// Bytes that are often meaningful to the decoders: hex digits and msgpack markers.
pub const INTERESTING: &[u8] =
    b"0123456789abcdefABCDEF\x00\x01\x90\x91\x93\x9f\xa0\xa2\xa4\xbf\xd9\xda\xdb\xdc\xdd\xff";

/// `len` bytes expanded from `seed` (splitmix64): one byte in four from
/// [`INTERESTING`], the rest uniform. Inputs are drawn as (length, seed) pairs rather
/// than byte by byte, which keeps a case cheap in a debug build; a failing case is
/// printed whole all the same.
pub fn expand(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = state;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^= x >> 31;
            if x % 4 == 0 {
                INTERESTING[(x >> 8) as usize % INTERESTING.len()]
            } else {
                (x >> 16) as u8
            }
        })
        .collect()
}

/// `len` hex digits (both cases) expanded from `seed`.
pub fn expand_hex(len: usize, seed: u64) -> Vec<u8> {
    const HEX: &[u8] = b"0123456789abcdefABCDEF";
    expand(len, seed)
        .into_iter()
        .map(|b| HEX[usize::from(b) % HEX.len()])
        .collect()
}

/// Arbitrary bytes, `0..=max` of them.
pub fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    (0..=max, any::<u64>()).prop_map(|(len, seed)| Bytes::from(expand(len, seed)))
}

/// 0 to 5 frames of arbitrary bytes.
pub fn any_frames() -> impl Strategy<Value = Vec<Bytes>> {
    prop::collection::vec(bytes(48), 0..=5)
}

/// A chain of 0 to 8 hashes of one length in 1..=40 bytes.
pub fn any_block_hashes() -> impl Strategy<Value = BlockHashes> {
    (1..=40u16, 0..=8usize, any::<u64>()).prop_map(|(len, count, seed)| {
        BlockHashes::new(len, Bytes::from(expand(usize::from(len) * count, seed)))
            .expect("whole hashes")
    })
}

/// One change to a valid message.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// XOR a byte of a frame (indices taken modulo the lengths).
    Flip {
        /// The frame.
        frame: usize,
        /// The byte within it.
        at: usize,
        /// The bits flipped.
        mask: u8,
    },
    /// Cut a frame to `len` bytes.
    Truncate {
        /// The frame.
        frame: usize,
        /// Bytes kept.
        len: usize,
    },
    /// Append bytes to a frame.
    Extend {
        /// The frame.
        frame: usize,
        /// The bytes appended.
        tail: Bytes,
    },
    /// Remove a frame.
    Drop {
        /// The frame.
        frame: usize,
    },
    /// Insert a frame.
    Insert {
        /// Where.
        frame: usize,
        /// The new frame.
        bytes: Bytes,
    },
    /// Replace a frame.
    Replace {
        /// The frame.
        frame: usize,
        /// Its new content.
        bytes: Bytes,
    },
}

/// Any one [`Mutation`], with indices and lengths small enough to land in a message.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<usize>(), 1..=255u8)
            .prop_map(|(frame, at, mask)| { Mutation::Flip { frame, at, mask } }),
        (any::<usize>(), 0..=64usize).prop_map(|(frame, len)| Mutation::Truncate { frame, len }),
        (any::<usize>(), bytes(16)).prop_map(|(frame, tail)| Mutation::Extend { frame, tail }),
        any::<usize>().prop_map(|frame| Mutation::Drop { frame }),
        (any::<usize>(), bytes(8)).prop_map(|(frame, bytes)| Mutation::Insert { frame, bytes }),
        (any::<usize>(), bytes(8)).prop_map(|(frame, bytes)| Mutation::Replace { frame, bytes }),
    ]
}

/// Applies `mutations` in turn (each a no-op where it does not apply).
pub fn mutate(mut frames: Vec<Bytes>, mutations: &[Mutation]) -> Vec<Bytes> {
    for m in mutations {
        let n = frames.len();
        match m {
            Mutation::Flip { frame, at, mask } if n > 0 => {
                let f = frame % n;
                if !frames[f].is_empty() {
                    let mut v = frames[f].to_vec();
                    let i = at % v.len();
                    v[i] ^= mask;
                    frames[f] = Bytes::from(v);
                }
            }
            Mutation::Truncate { frame, len } if n > 0 => {
                let f = frame % n;
                let keep = (*len).min(frames[f].len());
                frames[f] = frames[f].slice(..keep);
            }
            Mutation::Extend { frame, tail } if n > 0 => {
                let f = frame % n;
                let mut v = frames[f].to_vec();
                v.extend_from_slice(tail);
                frames[f] = Bytes::from(v);
            }
            Mutation::Drop { frame } if n > 0 => {
                frames.remove(frame % n);
            }
            Mutation::Insert { frame, bytes } if n < 6 => {
                frames.insert(frame % (n + 1), bytes.clone());
            }
            Mutation::Replace { frame, bytes } if n > 0 => {
                frames[frame % n] = bytes.clone();
            }
            _ => {}
        }
    }
    frames
}

/// A valid lookup request of `format`, then 0 to 3 mutations.
pub fn mutated_lookup(format: Format) -> impl Strategy<Value = Vec<Bytes>> {
    (
        any::<u32>(),
        prop_oneof![Just(16u32), Just(512), 1..=64u32],
        any_block_hashes(),
        prop::collection::vec(mutation(), 0..=3),
    )
        .prop_map(move |(num_tokens, block_size, hashes, mutations)| {
            mutate(
                wire::encode_lookup(format, num_tokens, block_size, &hashes),
                &mutations,
            )
        })
}

/// A `hash_len` field value that is often at or around a limit.
pub fn hash_len_field() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(0u16),
        Just(1),
        Just(8),
        Just(32),
        Just(MAX_HASH_LEN as u16),
        Just(MAX_HASH_LEN as u16 + 1),
        Just(u16::MAX),
        any::<u16>(),
    ]
}

/// A `tagged-blob` lookup: frame 0 is `lookup`; the rest structured (fields of the
/// right or a wrong length, a hash frame that is often a multiple of `hash_len`),
/// arbitrary, or a mutated valid request.
pub fn tagged_request() -> impl Strategy<Value = Vec<Bytes>> {
    let structured = (
        prop_oneof![4 => Just(4usize), 1 => 0..=6usize],
        any::<u32>(),
        prop_oneof![4 => Just(2usize), 1 => 0..=4usize],
        hash_len_field(),
        0..=8usize,
        bytes(MAX_FRAME),
        prop::collection::vec(bytes(8), 0..=1),
    )
        .prop_map(
            |(tokens_len, tokens, len_len, hash_len, count, filler, extra)| {
                let tokens = tokens.to_be_bytes().repeat(2);
                let len = hash_len.to_be_bytes().repeat(2);
                // Usually `count` whole hashes; otherwise whatever the filler holds.
                let want = usize::from(hash_len) * count;
                let hashes = if want <= filler.len() {
                    filler.slice(..want)
                } else {
                    filler
                };
                let mut frames = vec![
                    Bytes::from_static(b"lookup"),
                    Bytes::copy_from_slice(&tokens[..tokens_len]),
                    Bytes::copy_from_slice(&len[..len_len]),
                    hashes,
                ];
                frames.extend(extra);
                frames
            },
        );
    let arbitrary = any_frames().prop_map(|mut frames| {
        if frames.is_empty() {
            frames.push(Bytes::new());
        }
        frames[0] = Bytes::from_static(b"lookup");
        frames
    });
    prop_oneof![
        structured,
        arbitrary,
        mutated_lookup(Format::TaggedBlob).prop_map(|mut frames| {
            // Keep it a tagged-blob lookup whatever the mutations did to frame 0.
            if frames.is_empty() {
                frames.push(Bytes::new());
            }
            frames[0] = Bytes::from_static(b"lookup");
            frames
        }),
    ]
}

/// An array or string header of MessagePack, of a random width, for `len`.
fn msgpack_header(kind: u8, len: u32, array: bool) -> Vec<u8> {
    let mut out = Vec::new();
    match (array, kind % 4) {
        (true, 0) if len < 16 => out.push(0x90 | len as u8),
        (true, 0 | 1) if len <= u32::from(u16::MAX) => {
            out.push(0xdc);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (true, _) => {
            out.push(0xdd);
            out.extend_from_slice(&len.to_be_bytes());
        }
        (false, 0) if len < 32 => out.push(0xa0 | len as u8),
        (false, 0 | 1) if len <= u32::from(u8::MAX) => {
            out.push(0xd9);
            out.push(len as u8);
        }
        (false, 0..=2) if len <= u32::from(u16::MAX) => {
            out.push(0xda);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (false, _) => {
            out.push(0xdb);
            out.extend_from_slice(&len.to_be_bytes());
        }
    }
    out
}

/// One string of a `msgpack-hex` array: header of some width, then digits that are
/// usually hex and sometimes not, of a length that is usually the header's.
fn msgpack_str() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<u8>(),
        prop_oneof![
            Just(64u32),
            Just(16),
            0..=70u32,
            // At the limit and just past it.
            Just(2 * MAX_HASH_LEN as u32),
            Just(2 * MAX_HASH_LEN as u32 + 2),
        ],
        any::<u64>(),
        prop_oneof![6 => Just(None), 1 => (0..=70usize).prop_map(Some)],
        prop_oneof![8 => Just(None), 1 => (any::<usize>(), any::<u8>()).prop_map(Some)],
    )
        .prop_map(|(kind, len, seed, dishonest_len, bad_digit)| {
            let mut out = msgpack_header(kind, len, false);
            // Usually as many digits as the header says; sometimes fewer or more.
            let mut digits = expand_hex(dishonest_len.unwrap_or(len as usize), seed);
            if let (Some((at, byte)), false) = (bad_digit, digits.is_empty()) {
                let i = at % digits.len();
                digits[i] = byte;
            }
            out.extend_from_slice(&digits);
            out
        })
}

/// Frame 1 of a `msgpack-hex` lookup: an array header claiming a count (often the
/// real one, sometimes far more), strings, sometimes trailing bytes; or arbitrary
/// bytes.
pub fn msgpack_array() -> impl Strategy<Value = Bytes> {
    let structured = (
        any::<u8>(),
        prop_oneof![
            Just(None),
            Just(Some(u32::MAX)),
            (0..=70_000u32).prop_map(Some)
        ],
        prop::collection::vec(msgpack_str(), 0..=4),
        prop::collection::vec(any::<u8>(), 0..=2),
    )
        .prop_map(|(kind, claim, strings, trailing)| {
            let count = claim.unwrap_or(strings.len() as u32);
            let mut out = msgpack_header(kind, count, true);
            for s in &strings {
                out.extend_from_slice(s);
            }
            out.extend_from_slice(&trailing);
            Bytes::from(out)
        });
    prop_oneof![3 => structured, 1 => bytes(MAX_FRAME)]
}

/// A `msgpack-hex` lookup: a 4-byte token frame and an array frame, or a mutated
/// valid request whose frame 0 is kept 4 bytes long.
pub fn msgpack_request() -> impl Strategy<Value = Vec<Bytes>> {
    prop_oneof![
        3 => (any::<[u8; 4]>(), msgpack_array())
            .prop_map(|(tokens, array)| vec![Bytes::copy_from_slice(&tokens), array]),
        1 => (mutated_lookup(Format::MsgpackHex), any::<[u8; 4]>(), bytes(8)).prop_map(
            |(mut frames, tokens, filler)| {
                frames.truncate(2);
                while frames.len() < 2 {
                    frames.push(filler.clone());
                }
                if frames[0].len() != 4 {
                    frames[0] = Bytes::copy_from_slice(&tokens);
                }
                frames
            }
        ),
    ]
}

/// A reply as a client may receive it: 0 to 3 frames, usually one, often of a
/// well-formed length.
pub fn reply_frames() -> impl Strategy<Value = Vec<Bytes>> {
    let one = prop_oneof![
        (any::<u32>(), 0..=8usize).prop_map(|(hit, boundaries)| {
            let mut v = hit.to_be_bytes().to_vec();
            v.resize(4 + 8 * boundaries, 0x5a);
            Bytes::from(v)
        }),
        bytes(72),
        prop::sample::select(vec![
            Bytes::from_static(&[0]),
            Bytes::from_static(&[1]),
            Bytes::from_static(&[2]),
        ]),
    ];
    prop_oneof![
        4 => one.prop_map(|f| vec![f]),
        1 => prop::collection::vec(bytes(12), 0..=3),
    ]
}

/// Any request a server may receive: either format, structured, mutated or
/// arbitrary, or a reset, or junk of any shape.
pub fn any_request() -> impl Strategy<Value = Vec<Bytes>> {
    prop_oneof![
        tagged_request(),
        msgpack_request(),
        Just(vec![Bytes::from_static(b"reset")]),
        any_frames(),
        (any_frames(), prop::sample::select(vec!["lookup", "reset"])).prop_map(
            |(mut frames, tag)| {
                frames.insert(0, Bytes::from_static(tag.as_bytes()));
                frames
            }
        ),
    ]
}
