//! Format names, golden byte vectors written out by hand from `spec/wire.md`, and
//! the decoding of well-formed requests.

use super::*;

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
