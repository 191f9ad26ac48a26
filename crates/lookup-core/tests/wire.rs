//! Wire codec tests: golden byte vectors written out by hand from `spec/wire.md`,
//! malformed inputs, and property tests (round trips, never panicking).

use bytes::Bytes;
use lookup_core::wire::{
    self, Format, LookupReply, MAX_HASH_LEN, MAX_HASHES, ServerRequest, TailKeyBoundary, WireError,
};
use lookup_core::{BlockHashes, Error};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

fn frames(parts: &[&[u8]]) -> Vec<Bytes> {
    parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
}

/// Three 32-byte hashes: 0x11 repeated, 0x22 repeated, 0x33 repeated.
fn three_hashes() -> BlockHashes {
    BlockHashes::from_hashes(&[[0x11u8; 32], [0x22; 32], [0x33; 32]]).unwrap()
}

/// The `msgpack-hex` frame 1 for [`three_hashes`], by hand: fixarray of 3 (`0x93`), then
/// three str8 (`0xd9`) of 64 (`0x40`) hex digits each.
fn three_hashes_msgpack() -> Vec<u8> {
    let mut v = vec![0x93];
    for digit in [b'1', b'2', b'3'] {
        v.extend_from_slice(&[0xd9, 0x40]);
        v.extend_from_slice(&[digit; 64]);
    }
    v
}

/// A str8 header for `hex` followed by its bytes.
fn str8(hex: &[u8]) -> Vec<u8> {
    let mut v = vec![0xd9, u8::try_from(hex.len()).unwrap()];
    v.extend_from_slice(hex);
    v
}

fn malformed(frames: &[Bytes]) -> (Format, WireError) {
    match wire::decode_request(frames) {
        ServerRequest::Malformed { format, error } => (format, error),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

fn msgpack_malformed(array: &[u8]) -> WireError {
    let (format, error) = malformed(&frames(&[&[0, 0, 0, 48], array]));
    assert_eq!(format, Format::MsgpackHex);
    error
}

fn tagged_malformed(parts: &[&[u8]]) -> WireError {
    let (format, error) = malformed(&frames(parts));
    assert_eq!(format, Format::TaggedBlob);
    error
}

// ---------------------------------------------------------------------------------
// Format
// ---------------------------------------------------------------------------------

#[test]
fn format_names_parse_and_display() {
    assert_eq!(Format::default(), Format::TaggedBlob);
    assert_eq!("tagged-blob".parse::<Format>().unwrap(), Format::TaggedBlob);
    assert_eq!("msgpack-hex".parse::<Format>().unwrap(), Format::MsgpackHex);
    assert_eq!(Format::TaggedBlob.to_string(), "tagged-blob");
    assert_eq!(Format::MsgpackHex.to_string(), "msgpack-hex");
    assert_eq!(
        "msgpack".parse::<Format>(),
        Err(Error::UnknownFormat("msgpack".to_owned()))
    );
}

// ---------------------------------------------------------------------------------
// Golden vectors
// ---------------------------------------------------------------------------------

#[test]
fn golden_tagged_lookup_request() {
    let mut hashes = Vec::new();
    hashes.extend_from_slice(&[0x11; 32]);
    hashes.extend_from_slice(&[0x22; 32]);
    hashes.extend_from_slice(&[0x33; 32]);
    let expected = frames(&[b"lookup", &[0x00, 0x00, 0x00, 0x30], &[0x00, 0x20], &hashes]);
    // block_size is not used by tagged-blob: num_tokens goes out unaligned.
    assert_eq!(
        wire::encode_lookup(Format::TaggedBlob, 48, 16, &three_hashes()),
        expected
    );
    let unaligned = wire::encode_lookup(Format::TaggedBlob, 50, 16, &three_hashes());
    assert_eq!(unaligned[1].as_ref(), &[0x00, 0x00, 0x00, 0x32]);
}

#[test]
fn golden_msgpack_lookup_request() {
    let array = three_hashes_msgpack();
    assert_eq!(array.len(), 1 + 3 * 66);
    let expected = frames(&[&[0x00, 0x00, 0x00, 0x30], &array]);
    assert_eq!(
        wire::encode_lookup(Format::MsgpackHex, 48, 16, &three_hashes()),
        expected
    );
}

#[test]
fn golden_msgpack_token_len_is_floored_to_block_size() {
    let at = |num_tokens, block_size| {
        wire::encode_lookup(Format::MsgpackHex, num_tokens, block_size, &three_hashes())[0].clone()
    };
    assert_eq!(at(50, 16).as_ref(), &[0x00, 0x00, 0x00, 0x30]); // 50 -> 48
    assert_eq!(at(63, 16).as_ref(), &[0x00, 0x00, 0x00, 0x30]); // 63 -> 48
    assert_eq!(at(15, 16).as_ref(), &[0x00, 0x00, 0x00, 0x00]); // 15 -> 0
    assert_eq!(at(1100, 512).as_ref(), &[0x00, 0x00, 0x04, 0x00]); // 1100 -> 1024
    // A block size of 0 would divide by zero: num_tokens goes out unfloored.
    assert_eq!(at(50, 0).as_ref(), &[0x00, 0x00, 0x00, 0x32]);
}

#[test]
fn golden_lookup_reply_with_two_boundaries() {
    let reply = LookupReply {
        hit_tokens: 32,
        boundaries: vec![
            TailKeyBoundary {
                group_id: 0,
                boundary_tokens: 16,
            },
            TailKeyBoundary {
                group_id: 1,
                boundary_tokens: 32,
            },
        ],
    };
    let bytes: [u8; 20] = [
        0x00, 0x00, 0x00, 0x20, // hit_tokens 32
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, // group 0, 16 tokens
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x20, // group 1, 32 tokens
    ];
    let encoded = wire::encode_lookup_reply(Format::TaggedBlob, &reply);
    assert_eq!(encoded.as_ref(), &bytes);
    assert_eq!(
        wire::decode_lookup_reply(Format::TaggedBlob, &[Bytes::copy_from_slice(&bytes)]),
        Ok(reply.clone())
    );

    // msgpack-hex has room for hit_tokens only.
    let msgpack = wire::encode_lookup_reply(Format::MsgpackHex, &reply);
    assert_eq!(msgpack.as_ref(), &[0x00, 0x00, 0x00, 0x20]);
    assert_eq!(
        wire::decode_lookup_reply(Format::MsgpackHex, &[msgpack]),
        Ok(LookupReply {
            hit_tokens: 32,
            boundaries: vec![]
        })
    );
}

#[test]
fn golden_plain_reply_is_four_bytes() {
    let reply = LookupReply {
        hit_tokens: 0x0102_0304,
        boundaries: vec![],
    };
    assert_eq!(
        wire::encode_lookup_reply(Format::TaggedBlob, &reply).as_ref(),
        &[0x01, 0x02, 0x03, 0x04]
    );
    assert_eq!(
        wire::decode_lookup_reply(Format::TaggedBlob, &frames(&[&[0x01, 0x02, 0x03, 0x04]])),
        Ok(reply)
    );
}

#[test]
fn golden_reset_request_and_replies() {
    assert_eq!(
        wire::encode_reset(Format::TaggedBlob),
        Ok(frames(&[b"reset"]))
    );
    assert_eq!(wire::encode_reset(Format::MsgpackHex), Err(Error::NoReset));
    assert_eq!(wire::encode_reset_reply(true).as_ref(), &[0x01]);
    assert_eq!(wire::encode_reset_reply(false).as_ref(), &[0x00]);
    assert_eq!(wire::decode_reset_reply(&frames(&[&[0x01]])), Ok(true));
    assert_eq!(wire::decode_reset_reply(&frames(&[&[0x00]])), Ok(false));
    assert_eq!(
        wire::decode_request(&frames(&[b"reset"])),
        ServerRequest::Reset
    );
}

#[test]
fn golden_empty_hashes() {
    let empty = BlockHashes::empty();
    let tagged = wire::encode_lookup(Format::TaggedBlob, 7, 16, &empty);
    assert_eq!(
        tagged,
        frames(&[b"lookup", &[0x00, 0x00, 0x00, 0x07], &[0x00, 0x00], b""])
    );
    let msgpack = wire::encode_lookup(Format::MsgpackHex, 7, 16, &empty);
    assert_eq!(msgpack, frames(&[&[0x00, 0x00, 0x00, 0x00], &[0x90]]));

    assert_eq!(
        wire::decode_request(&tagged),
        ServerRequest::Lookup {
            format: Format::TaggedBlob,
            num_tokens: 7,
            block_hashes: BlockHashes::empty(),
        }
    );
    assert_eq!(
        wire::decode_request(&msgpack),
        ServerRequest::Lookup {
            format: Format::MsgpackHex,
            num_tokens: 0,
            block_hashes: BlockHashes::empty(),
        }
    );
}

#[test]
fn golden_unknown_tag() {
    assert_eq!(wire::unknown_tag_reply().as_ref(), &[0x00]);
    for request in [
        frames(&[]),
        frames(&[b"hello"]),
        frames(&[b""]),
        frames(&[b"RESET"]),
        frames(&[b"reset", b""]), // reset has exactly one frame
        frames(&[b"lookupX", b"", b"", b""]),
        frames(&[b"abc", b"\x90"]), // frame 0 of 3 bytes is no token_len
        frames(&[b"abcde", b"\x90"]),
        frames(&[&[0, 0, 0, 1], b"\x90", b""]), // msgpack-hex has exactly 2 frames
    ] {
        assert_eq!(
            wire::decode_request(&request),
            ServerRequest::Unknown,
            "{request:?}"
        );
    }
}

// ---------------------------------------------------------------------------------
// decode_request: well-formed
// ---------------------------------------------------------------------------------

#[test]
fn decode_golden_tagged_request() {
    let request = wire::encode_lookup(Format::TaggedBlob, 48, 16, &three_hashes());
    let decoded = wire::decode_request(&request);
    assert_eq!(
        decoded,
        ServerRequest::Lookup {
            format: Format::TaggedBlob,
            num_tokens: 48,
            block_hashes: three_hashes(),
        }
    );
    // The hashes are a slice of the received frame, not a copy.
    let ServerRequest::Lookup { block_hashes, .. } = decoded else {
        unreachable!()
    };
    assert_eq!(block_hashes.as_bytes().as_ptr(), request[3].as_ptr());
    assert_eq!(block_hashes.get(1), Some(&[0x22; 32][..]));
}

#[test]
fn decode_golden_msgpack_request() {
    let request = frames(&[&[0x00, 0x00, 0x00, 0x30], &three_hashes_msgpack()]);
    assert_eq!(
        wire::decode_request(&request),
        ServerRequest::Lookup {
            format: Format::MsgpackHex,
            num_tokens: 48,
            block_hashes: three_hashes(),
        }
    );
}

#[test]
fn decode_msgpack_accepts_uppercase_hex_and_fixstr() {
    // fixarray 2, fixstr 4 (0xa4) "AbCd", fixstr 4 "0F10".
    let request = frames(&[
        &[0x00, 0x00, 0x00, 0x20],
        &[
            0x92, 0xa4, b'A', b'b', b'C', b'd', 0xa4, b'0', b'F', b'1', b'0',
        ],
    ]);
    assert_eq!(
        wire::decode_request(&request),
        ServerRequest::Lookup {
            format: Format::MsgpackHex,
            num_tokens: 32,
            block_hashes: BlockHashes::from_hashes(&[[0xab, 0xcd], [0x0f, 0x10]]).unwrap(),
        }
    );
}

#[test]
fn decode_tagged_accepts_hash_len_with_empty_hash_frame() {
    // hash_len 32, zero hashes: 32 * 0 bytes.
    let request = frames(&[b"lookup", &[0, 0, 0, 5], &[0x00, 0x20], b""]);
    assert_eq!(
        wire::decode_request(&request),
        ServerRequest::Lookup {
            format: Format::TaggedBlob,
            num_tokens: 5,
            block_hashes: BlockHashes::empty(),
        }
    );
}

#[test]
fn decode_accepts_the_limits_exactly() {
    let longest = vec![0xab; MAX_HASH_LEN];
    let request = frames(&[b"lookup", &[0, 0, 0, 16], &[0x01, 0x00], &longest]);
    assert!(matches!(
        wire::decode_request(&request),
        ServerRequest::Lookup { ref block_hashes, .. } if block_hashes.len() == 1
    ));
    let most = vec![0x5a; MAX_HASHES];
    let request = frames(&[b"lookup", &[0, 0, 0, 16], &[0x00, 0x01], &most]);
    assert!(matches!(
        wire::decode_request(&request),
        ServerRequest::Lookup { ref block_hashes, .. } if block_hashes.len() == MAX_HASHES
    ));
}

// ---------------------------------------------------------------------------------
// decode_request: malformed tagged-blob
// ---------------------------------------------------------------------------------

#[test]
fn malformed_tagged_frame_counts() {
    assert_eq!(
        tagged_malformed(&[b"lookup"]),
        WireError::WrongFrameCount {
            expected: 4,
            got: 1
        }
    );
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 48], &[0, 32]]),
        WireError::WrongFrameCount {
            expected: 4,
            got: 3
        }
    );
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 48], &[0, 0], b"", b""]),
        WireError::WrongFrameCount {
            expected: 4,
            got: 5
        }
    );
}

#[test]
fn malformed_tagged_short_fields() {
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 48], &[0, 0], b""]),
        WireError::BadLength {
            what: "num_tokens",
            expected: 4,
            got: 3
        }
    );
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 0, 48], &[0, 0], b""]),
        WireError::BadLength {
            what: "num_tokens",
            expected: 4,
            got: 5
        }
    );
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 48], &[32], b""]),
        WireError::BadLength {
            what: "hash_len",
            expected: 2,
            got: 1
        }
    );
}

#[test]
fn malformed_tagged_hash_bytes() {
    // 65 bytes are not a multiple of 32.
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 48], &[0, 32], &[0x11; 65]]),
        WireError::HashBytes {
            hash_len: 32,
            bytes: 65
        }
    );
    // hash_len 0 requires an empty frame 3.
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 48], &[0, 0], &[0x11; 32]]),
        WireError::HashBytes {
            hash_len: 0,
            bytes: 32
        }
    );
}

#[test]
fn malformed_tagged_limits() {
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 48], &[0x01, 0x01], &[0; 257]]),
        WireError::HashTooLong {
            len: 257,
            max: MAX_HASH_LEN
        }
    );
    // Checked before the bytes: a claimed 65535-byte hash with no bytes at all.
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 48], &[0xff, 0xff], b""]),
        WireError::HashTooLong {
            len: 65_535,
            max: MAX_HASH_LEN
        }
    );
    assert_eq!(
        tagged_malformed(&[b"lookup", &[0, 0, 0, 48], &[0, 1], &vec![0; MAX_HASHES + 1]]),
        WireError::TooManyHashes {
            count: MAX_HASHES + 1,
            max: MAX_HASHES
        }
    );
}

// ---------------------------------------------------------------------------------
// decode_request: malformed msgpack-hex
// ---------------------------------------------------------------------------------

#[test]
fn malformed_msgpack_truncated() {
    // The golden array cut inside its last string.
    let full = three_hashes_msgpack();
    assert!(matches!(
        msgpack_malformed(&full[..full.len() - 1]),
        WireError::Truncated { .. }
    ));
    // Cut after the first string: the frame cannot hold the two claimed strings left.
    assert_eq!(
        msgpack_malformed(&full[..1 + 66 + 1]),
        WireError::Truncated {
            needed: 64 + 2 * 65,
            available: 65
        }
    );
    // Cut inside a str32 header (0xdb needs 4 length bytes, 2 present): rmp reports it.
    assert!(matches!(
        msgpack_malformed(&[0x92, 0xa2, b'a', b'b', 0xdb, 0x00, 0x00]),
        WireError::Msgpack(_)
    ));
    // Cut inside the second string's digits.
    assert_eq!(
        msgpack_malformed(&[0x92, 0xa2, b'a', b'b', 0xd9, 0x02, b'a']),
        WireError::Truncated {
            needed: 2,
            available: 1
        }
    );
    // An empty frame has no array header.
    assert!(matches!(msgpack_malformed(b""), WireError::Msgpack(_)));
    // fixarray of 3 with a single string.
    let mut one = vec![0x93];
    one.extend(str8(&[b'1'; 64]));
    assert_eq!(
        msgpack_malformed(&one),
        WireError::Truncated {
            needed: 64 + 2 * 65,
            available: 64
        }
    );
}

#[test]
fn malformed_msgpack_not_an_array_of_str() {
    // A lone string, a map, and an array of bin (0xc4) instead of str.
    assert!(matches!(
        msgpack_malformed(&[0xa2, b'a', b'b']),
        WireError::Msgpack(_)
    ));
    assert!(matches!(msgpack_malformed(&[0x80]), WireError::Msgpack(_)));
    assert!(matches!(
        msgpack_malformed(&[0x91, 0xc4, 0x02, 0xab, 0xcd]),
        WireError::Msgpack(_)
    ));
    // An integer where the second string should be.
    assert!(matches!(
        msgpack_malformed(&[0x92, 0xa2, b'a', b'b', 0x01, 0x00, 0x00]),
        WireError::Msgpack(_)
    ));
}

#[test]
fn malformed_msgpack_bad_hex() {
    // Non-hex digits in the second hash.
    let mut array = vec![0x92];
    array.extend(str8(&[b'a'; 64]));
    array.extend(str8(&[b'g'; 64]));
    assert_eq!(msgpack_malformed(&array), WireError::BadHex { index: 1 });
    // Odd length.
    assert_eq!(
        msgpack_malformed(&[0x91, 0xa3, b'a', b'b', b'c']),
        WireError::BadHex { index: 0 }
    );
    // A space and a "0x" prefix are not hex.
    assert_eq!(
        msgpack_malformed(&[0x91, 0xa2, b' ', b'a']),
        WireError::BadHex { index: 0 }
    );
    assert_eq!(
        msgpack_malformed(&[0x91, 0xa4, b'0', b'x', b'a', b'b']),
        WireError::BadHex { index: 0 }
    );
    // An empty string names no block.
    assert_eq!(
        msgpack_malformed(&[0x91, 0xa0]),
        WireError::EmptyHash { index: 0 }
    );
}

#[test]
fn malformed_msgpack_mixed_lengths() {
    let mut array = vec![0x93];
    array.extend(str8(&[b'a'; 64]));
    array.extend(str8(&[b'b'; 64]));
    array.extend(str8(&[b'c'; 62]));
    assert_eq!(
        msgpack_malformed(&array),
        WireError::UnequalHashLengths { index: 2 }
    );
}

#[test]
fn malformed_msgpack_too_many_hashes_claimed() {
    // array32 header claiming 4,294,967,295 entries, in 5 bytes plus one string.
    assert_eq!(
        msgpack_malformed(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0xa2, b'a', b'b']),
        WireError::TooManyHashes {
            count: 4_294_967_295,
            max: MAX_HASHES
        }
    );
    // array32 claiming MAX_HASHES + 1.
    assert_eq!(
        msgpack_malformed(&[0xdd, 0x00, 0x01, 0x00, 0x01]),
        WireError::TooManyHashes {
            count: MAX_HASHES + 1,
            max: MAX_HASHES
        }
    );
    // Within the count limit but far beyond the bytes present: refused before any
    // buffer is sized from the claim (65535 strings of 512 digits in 8 bytes).
    assert_eq!(
        msgpack_malformed(&[0xdc, 0xff, 0xff, 0xda, 0x02, 0x00, b'a', b'b']),
        WireError::Truncated {
            needed: 512 + 65_534 * 513,
            available: 2
        }
    );
}

#[test]
fn malformed_msgpack_hash_too_long() {
    // str16 (0xda) of 1000 hex digits: a 500-byte hash, claimed in 3 bytes.
    assert_eq!(
        msgpack_malformed(&[0x91, 0xda, 0x03, 0xe8]),
        WireError::HashTooLong {
            len: 500,
            max: MAX_HASH_LEN
        }
    );
    // str32 (0xdb) claiming 4 GiB.
    assert_eq!(
        msgpack_malformed(&[0x91, 0xdb, 0xff, 0xff, 0xff, 0xfe]),
        WireError::HashTooLong {
            len: 0x7fff_ffff,
            max: MAX_HASH_LEN
        }
    );
}

#[test]
fn malformed_msgpack_trailing_bytes() {
    let mut array = three_hashes_msgpack();
    array.push(0xc0);
    assert_eq!(msgpack_malformed(&array), WireError::TrailingBytes(1));
    assert_eq!(
        msgpack_malformed(&[0x90, 0x90, 0x90]),
        WireError::TrailingBytes(2)
    );
}

// ---------------------------------------------------------------------------------
// Reply decode errors
// ---------------------------------------------------------------------------------

#[test]
fn lookup_reply_bad_lengths() {
    for len in [0usize, 3, 5, 11] {
        assert_eq!(
            wire::decode_lookup_reply(Format::TaggedBlob, &[Bytes::from(vec![0; len])]),
            Err(WireError::ReplyLength(len)),
            "tagged-blob, {len} bytes"
        );
    }
    for len in [0usize, 3, 5, 8, 12] {
        assert_eq!(
            wire::decode_lookup_reply(Format::MsgpackHex, &[Bytes::from(vec![0; len])]),
            Err(WireError::ReplyLength(len)),
            "msgpack-hex, {len} bytes"
        );
    }
    // 12 bytes are 4 + 8: one boundary.
    assert_eq!(
        wire::decode_lookup_reply(Format::TaggedBlob, &[Bytes::from(vec![0; 12])])
            .unwrap()
            .boundaries
            .len(),
        1
    );
}

#[test]
fn lookup_reply_wrong_frame_counts() {
    for format in [Format::TaggedBlob, Format::MsgpackHex] {
        assert_eq!(
            wire::decode_lookup_reply(format, &frames(&[&[0, 0, 0, 16], &[0, 0, 0, 16]])),
            Err(WireError::WrongFrameCount {
                expected: 1,
                got: 2
            })
        );
        assert_eq!(
            wire::decode_lookup_reply(format, &[]),
            Err(WireError::WrongFrameCount {
                expected: 1,
                got: 0
            })
        );
    }
}

#[test]
fn reset_reply_errors() {
    assert_eq!(
        wire::decode_reset_reply(&frames(&[&[0x02]])),
        Err(WireError::ResetReply(vec![0x02]))
    );
    assert_eq!(
        wire::decode_reset_reply(&frames(&[b""])),
        Err(WireError::ResetReply(vec![]))
    );
    assert_eq!(
        wire::decode_reset_reply(&frames(&[&[0x01, 0x00]])),
        Err(WireError::ResetReply(vec![0x01, 0x00]))
    );
    // Only the first 16 bytes of a long frame are kept.
    assert_eq!(
        wire::decode_reset_reply(&[Bytes::from(vec![0x07; 1000])]),
        Err(WireError::ResetReply(vec![0x07; 16]))
    );
    assert_eq!(
        wire::decode_reset_reply(&frames(&[&[0x01], &[0x01]])),
        Err(WireError::WrongFrameCount {
            expected: 1,
            got: 2
        })
    );
}

// ---------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------

fn any_format() -> impl Strategy<Value = Format> {
    prop_oneof![Just(Format::TaggedBlob), Just(Format::MsgpackHex)]
}

/// 0 to 100 hashes of one length in 1..=64 bytes.
fn any_block_hashes() -> impl Strategy<Value = BlockHashes> {
    (1..=64usize)
        .prop_flat_map(|len| {
            prop::collection::vec(prop::collection::vec(any::<u8>(), len), 0..=100)
        })
        .prop_map(|hashes| BlockHashes::from_hashes(&hashes).unwrap())
}

fn any_reply() -> impl Strategy<Value = LookupReply> {
    let boundary =
        (any::<u32>(), any::<u32>()).prop_map(|(group_id, boundary_tokens)| TailKeyBoundary {
            group_id,
            boundary_tokens,
        });
    (any::<u32>(), prop::collection::vec(boundary, 0..=8)).prop_map(|(hit_tokens, boundaries)| {
        LookupReply {
            hit_tokens,
            boundaries,
        }
    })
}

/// A byte that is often meaningful to the decoders: hex digits and msgpack headers.
fn wire_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        prop::sample::select(
            b"0123456789abcdefABCDEF\x00\x01\x90\x91\x93\xa0\xa2\xa4\xd9\xda\xdb\xdc\xdd\xff"
                .to_vec()
        ),
    ]
}

fn any_frames() -> impl Strategy<Value = Vec<Bytes>> {
    prop::collection::vec(
        prop::collection::vec(wire_byte(), 0..48).prop_map(Bytes::from),
        0..=5,
    )
}

proptest! {
    #[test]
    fn lookup_request_round_trips(
        format in any_format(),
        num_tokens in any::<u32>(),
        block_size in prop_oneof![Just(16u32), Just(512), 1..=1024u32],
        block_hashes in any_block_hashes(),
    ) {
        let frames = wire::encode_lookup(format, num_tokens, block_size, &block_hashes);
        let expected_tokens = match format {
            Format::TaggedBlob => num_tokens,
            Format::MsgpackHex => num_tokens / block_size * block_size,
        };
        prop_assert_eq!(
            wire::decode_request(&frames),
            ServerRequest::Lookup { format, num_tokens: expected_tokens, block_hashes }
        );
    }

    #[test]
    fn lookup_reply_round_trips(format in any_format(), reply in any_reply()) {
        let frame = wire::encode_lookup_reply(format, &reply);
        let expected = match format {
            Format::TaggedBlob => reply,
            Format::MsgpackHex => LookupReply { hit_tokens: reply.hit_tokens, boundaries: vec![] },
        };
        prop_assert_eq!(frame.len(), 4 + 8 * expected.boundaries.len());
        prop_assert_eq!(wire::decode_lookup_reply(format, &[frame]), Ok(expected));
    }

    #[test]
    fn reset_reply_round_trips(ok in any::<bool>()) {
        prop_assert_eq!(wire::decode_reset_reply(&[wire::encode_reset_reply(ok)]), Ok(ok));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn decoders_never_panic(frames in any_frames()) {
        let _ = wire::decode_request(&frames);
        for format in [Format::TaggedBlob, Format::MsgpackHex] {
            let _ = wire::decode_lookup_reply(format, &frames);
        }
        let _ = wire::decode_reset_reply(&frames);
    }

    #[test]
    fn tagged_lookup_decoder_never_panics(mut frames in any_frames()) {
        if frames.is_empty() {
            frames.push(Bytes::new());
        }
        frames[0] = Bytes::from_static(b"lookup");
        let request = wire::decode_request(&frames);
        let is_tagged = matches!(
            request,
            ServerRequest::Lookup { format: Format::TaggedBlob, .. }
                | ServerRequest::Malformed { format: Format::TaggedBlob, .. }
        );
        prop_assert!(is_tagged, "{:?}", request);
    }

    #[test]
    fn msgpack_lookup_decoder_never_panics(
        token_len in prop::collection::vec(any::<u8>(), 4),
        array in prop::collection::vec(wire_byte(), 0..160),
    ) {
        let request = wire::decode_request(&[Bytes::from(token_len), Bytes::from(array)]);
        let is_msgpack = matches!(
            request,
            ServerRequest::Lookup { format: Format::MsgpackHex, .. }
                | ServerRequest::Malformed { format: Format::MsgpackHex, .. }
        );
        prop_assert!(is_msgpack, "{:?}", request);
    }
}
