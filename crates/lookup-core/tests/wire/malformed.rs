//! Malformed requests (both formats) and replies: each gets its exact error.

use super::*;

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

/// `spec/wire.md`, "Store unavailable": the server's error reply to a lookup is the
/// single byte `0x00` in both formats, read as unavailable, never as a miss; any other
/// short reply stays malformed.
#[test]
fn store_unavailable_reply_is_one_byte_read_as_unavailable() {
    for format in [Format::TaggedBlob, Format::MsgpackHex] {
        let reply = wire::encode_store_unavailable(format);
        assert_eq!(reply.as_ref(), &[0x00], "{format}");
        assert_eq!(
            wire::decode_lookup_reply(format, &[reply]),
            Err(WireError::StoreUnavailable),
            "{format}"
        );
        assert_eq!(
            wire::decode_lookup_reply(format, &[Bytes::from_static(&[0x01])]),
            Err(WireError::ReplyLength(1)),
            "{format}"
        );
        assert_eq!(
            wire::decode_lookup_reply(format, &[Bytes::from_static(&[0x00, 0x00])]),
            Err(WireError::ReplyLength(2)),
            "{format}"
        );
    }
}

#[test]
fn lookup_reply_bad_lengths() {
    for len in [0usize, 3, 5, 11] {
        assert_eq!(
            wire::decode_lookup_reply(Format::TaggedBlob, &[Bytes::from(vec![0; len])]),
            Err(WireError::ReplyLength(len)),
            "tagged-blob, {len} bytes"
        );
    }
    // One byte other than the error reply `0x00` is broken, not an error reply.
    assert_eq!(
        wire::decode_lookup_reply(Format::TaggedBlob, &[Bytes::from_static(&[0x01])]),
        Err(WireError::ReplyLength(1))
    );
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
