//! Property tests: round trips of both formats, and decoders that never panic.

use super::*;

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
