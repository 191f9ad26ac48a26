//! Property tests of the reply decoders: arbitrary and mutated bytes never panic, and
//! whatever the encoders write decodes back to the same value.

use mooncake_master::StoreErrorCode;
use mooncake_master::codec::{self, ExistResult, REPLY_HEADER_LEN, ReplyHeader, TypeLiteral};
use proptest::prelude::*;

fn every_decoder(bytes: &[u8]) {
    let _ = ReplyHeader::decode(bytes);
    let _ = codec::RequestHeader::decode(bytes);
    let _ = codec::decode_batch_exist_key_reply(bytes);
    let _ = codec::decode_exist_key_reply(bytes);
    let _ = codec::decode_service_ready_reply(bytes);
    for err_code in [4, 11, 255] {
        let _ = codec::decode_error_reply(err_code, bytes);
    }
    let _ = codec::decode_batch_exist_key_args(bytes);
    let _ = codec::decode_exist_key_args(bytes);
}

fn literal() -> impl Strategy<Value = TypeLiteral> {
    prop_oneof![Just(TypeLiteral::Omit), Just(TypeLiteral::Include)]
}

fn exist_result() -> impl Strategy<Value = ExistResult> {
    prop_oneof![
        any::<bool>().prop_map(Ok),
        any::<i32>().prop_map(|c| Err(StoreErrorCode(c))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        every_decoder(&bytes);
    }

    /// Valid prologues (either form, any width) followed by arbitrary bytes reach the
    /// length and element paths that random bytes rarely hit.
    #[test]
    fn valid_prologue_then_arbitrary_bytes_never_panic(
        prologue in prop_oneof![
            Just(vec![0x5c, 0x8c, 0x5f, 0x2a]),
            Just(vec![0x5d, 0x8c, 0x5f, 0x2a, 0x04, 0x84, 0x87, 0x0b, 0x01, 0x00]),
            (0u8..4).prop_map(|w| vec![0x5d, 0x8c, 0x5f, 0x2a, w << 3]),
            Just(vec![0xd2, 0x00, 0xe8, 0x90]),
            Just(vec![0x34, 0xcc, 0xb3, 0x1c]),
            Just(vec![0x76, 0xfa, 0xcf, 0x9d]),
        ],
        tail in proptest::collection::vec(any::<u8>(), 0..48),
    ) {
        let mut bytes = prologue;
        bytes.extend_from_slice(&tail);
        every_decoder(&bytes);
    }

    /// Real replies with bytes flipped, cut or appended.
    #[test]
    fn mutated_replies_never_panic(
        answers in proptest::collection::vec(exist_result(), 0..80),
        literal in literal(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut frame = Vec::new();
        codec::encode_batch_exist_key_reply(&mut frame, 1, &answers, literal);
        let mut body = frame.split_off(REPLY_HEADER_LEN);
        for (at, byte) in flips {
            let i = at.index(body.len());
            body[i] ^= byte;
        }
        every_decoder(&body);
        every_decoder(&body[..cut.index(body.len() + 1)]);
    }
}

proptest! {

    #[test]
    fn batch_exist_key_replies_round_trip(
        answers in proptest::collection::vec(exist_result(), 0..600),
        literal in literal(),
        seq in any::<u32>(),
    ) {
        let mut frame = Vec::new();
        codec::encode_batch_exist_key_reply(&mut frame, seq, &answers, literal);
        let header = ReplyHeader::decode(&frame).unwrap();
        prop_assert_eq!(header.seq_num, seq);
        prop_assert_eq!(header.body_length as usize, frame.len() - REPLY_HEADER_LEN);
        let decoded = codec::decode_batch_exist_key_reply(&frame[REPLY_HEADER_LEN..]).unwrap();
        prop_assert_eq!(decoded, answers);
    }

    #[test]
    fn batch_exist_key_requests_round_trip(
        keys in proptest::collection::vec("[a-z0-9@:_]{0,40}", 0..300),
        tenant in proptest::option::of("[a-z]{0,10}"),
        long_key in proptest::option::of(300usize..70_000),
        literal in literal(),
    ) {
        let mut keys = keys;
        if let Some(len) = long_key {
            keys.push("x".repeat(len));
        }
        let mut frame = Vec::new();
        codec::encode_batch_exist_key(&mut frame, 1, &keys, tenant.as_deref(), literal).unwrap();
        let args = codec::decode_batch_exist_key_args(&frame[codec::REQUEST_HEADER_LEN..]).unwrap();
        prop_assert_eq!(args.keys, keys);
        prop_assert_eq!(args.tenant_id, tenant);
    }
}
