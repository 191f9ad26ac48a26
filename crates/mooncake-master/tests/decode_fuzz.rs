//! Property tests of the decoders: arbitrary and mutated bytes never panic and get
//! the exact answer wherever the bytes alone decide it (headers field by field, the
//! type-hash check, an unchanged reply, a cut or lengthened one), and whatever the
//! encoders write decodes back to the same value.

use mooncake_master::StoreErrorCode;
use mooncake_master::codec::{
    self, CodecError, ExistResult, FunctionId, REPLY_HEADER_LEN, ReplyHeader, TypeLiteral,
};
use proptest::prelude::*;

/// Type hashes of the replies (`spec/mooncake-master-rpc.md`, "struct_pack"), bit 0
/// (metainfo follows) clear.
const BATCH_EXIST_REPLY: u32 = 0x2a5f_8c5c;
const EXIST_REPLY: u32 = 0x90e8_00d2;
const SERVICE_READY_REPLY: u32 = 0x1cb3_cc34;
const INT64_REPLY: u32 = 0x8666_6834;

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// What a fixed-size coro_rpc header decoder must answer for `bytes`, written from
/// the spec independently of the codec: too short, bad magic, a newer version, else
/// the little-endian fields.
fn header_check(bytes: &[u8], len: usize) -> Result<(), CodecError> {
    if bytes.len() < len {
        return Err(CodecError::Truncated {
            needed: len,
            remaining: bytes.len(),
        });
    }
    if bytes[0] != 0x15 {
        return Err(CodecError::BadMagic(bytes[0]));
    }
    if bytes[1] > 0 {
        return Err(CodecError::UnsupportedVersion(bytes[1]));
    }
    Ok(())
}

/// The error a reply decoder expecting type hash `expected` must give `body` when
/// its first 4 bytes do not carry that hash (bits 1-31), or `None` when they do.
fn hash_error(body: &[u8], expected: u32) -> Option<CodecError> {
    if body.len() < 4 {
        return Some(CodecError::Truncated {
            needed: 4,
            remaining: body.len(),
        });
    }
    let got = le32(body, 0) & !1;
    (got != expected).then_some(CodecError::TypeHashMismatch { expected, got })
}

/// Every decoder on `bytes`: no panic, and the exact answer wherever it follows from
/// the bytes alone: both headers field by field (or their error), and each reply
/// decoder's type-hash check (a body whose hash is not the decoder's type fails with
/// exactly that mismatch). Past a matching hash the answer depends on the data (a
/// flipped bool or code byte is another valid answer), so only the absence of a
/// panic is checked there; round trips check the values.
fn every_decoder(bytes: &[u8]) {
    let reply = ReplyHeader::decode(bytes);
    match header_check(bytes, REPLY_HEADER_LEN) {
        Err(e) => assert_eq!(reply, Err(e)),
        Ok(()) => assert_eq!(
            reply,
            Ok(ReplyHeader {
                err_code: bytes[2],
                msg_type: bytes[3],
                seq_num: le32(bytes, 4),
                body_length: le32(bytes, 8),
                attach_length: le32(bytes, 12),
            })
        ),
    }
    let request = codec::RequestHeader::decode(bytes);
    match header_check(bytes, codec::REQUEST_HEADER_LEN) {
        Err(e) => assert_eq!(request, Err(e)),
        Ok(()) if bytes[2] != 0 => {
            assert_eq!(request, Err(CodecError::UnsupportedSerializeType(bytes[2])));
        }
        Ok(()) => assert_eq!(
            request,
            Ok(codec::RequestHeader {
                seq_num: le32(bytes, 4),
                function_id: FunctionId(le32(bytes, 8)),
                body_length: le32(bytes, 12),
                attach_length: le32(bytes, 16),
            })
        ),
    }
    let batch = codec::decode_batch_exist_key_reply(bytes);
    if let Some(e) = hash_error(bytes, BATCH_EXIST_REPLY) {
        assert_eq!(batch, Err(e));
    }
    let exist = codec::decode_exist_key_reply(bytes);
    if let Some(e) = hash_error(bytes, EXIST_REPLY) {
        assert_eq!(exist, Err(e));
    }
    let ready = codec::decode_service_ready_reply(bytes);
    if let Some(e) = hash_error(bytes, SERVICE_READY_REPLY) {
        assert_eq!(ready, Err(e));
    }
    let removed = codec::decode_remove_all_reply(bytes);
    if let Some(e) = hash_error(bytes, INT64_REPLY) {
        assert_eq!(removed, Err(e));
    }
    // Error bodies and arguments accept several types (a string or a (code, string)
    // pair; with or without the tenant): no panic is what is known.
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
        let original = frame.split_off(REPLY_HEADER_LEN);
        let mut body = original.clone();
        for (at, byte) in flips {
            let i = at.index(body.len());
            body[i] ^= byte;
        }
        every_decoder(&body);
        if body == original {
            // No flip changed a byte (a zero xor, or two that cancel): the exact answers.
            prop_assert_eq!(codec::decode_batch_exist_key_reply(&body), Ok(answers.clone()));
        }
        let cut = cut.index(body.len() + 1);
        every_decoder(&body[..cut]);
        if cut < original.len() && body == original {
            // A reply cut short never decodes: every answer has its bytes.
            prop_assert!(codec::decode_batch_exist_key_reply(&body[..cut]).is_err());
        }
        // Bytes appended to a whole reply are refused, never read as more answers.
        let mut longer = original.clone();
        longer.push(0);
        prop_assert_eq!(
            codec::decode_batch_exist_key_reply(&longer),
            Err(CodecError::TrailingBytes { count: 1 })
        );
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
