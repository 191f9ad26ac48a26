//! Golden bytes from `spec/mooncake-master-rpc.md` (captured from the real PyPI
//! client and master, 0.3.13.post1), round trips, and malformed input.

use md5::{Digest, Md5};

use super::*;
use crate::StoreErrorCode;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn md5_32(bytes: &[u8]) -> u32 {
    let digest = Md5::digest(bytes);
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

#[test]
fn function_ids_are_md5_of_the_qualified_name() {
    for (id, name) in [
        (FunctionId::BATCH_EXIST_KEY, "BatchExistKey"),
        (FunctionId::EXIST_KEY, "ExistKey"),
        (FunctionId::SERVICE_READY, "ServiceReady"),
        (FunctionId::PING, "Ping"),
        (FunctionId::REMOVE_ALL, "RemoveAll"),
    ] {
        let qualified = format!("mooncake::WrappedMasterService::{name}");
        assert_eq!(id.0, md5_32(qualified.as_bytes()), "{qualified}");
        assert_eq!(id.name(), Some(name));
    }
    assert_eq!(FunctionId::BATCH_EXIST_KEY.0, 0xb89f_a6b0);
    assert_eq!(FunctionId(1).name(), None);
}

#[test]
fn type_hashes_are_md5_of_the_literal_with_bit_0_cleared() {
    for ty in types::ALL {
        assert_eq!(ty.hash, md5_32(ty.literal) & !1, "{:02x?}", ty.literal);
    }
}

const BATCH_REQUEST_2_KEYS: &str = "
    15 00 00 00  07 00 00 00  b0 a6 9f b8  1c 00 00 00  00 00 00 00
    63 8d f7 00  04  fd 84 80 0c 80 0c ff 00  02  02 6b 31  02 6b 32
    07 64 65 66 61 75 6c 74";

#[test]
fn batch_exist_key_request_matches_the_real_client_debug_form() {
    let mut out = Vec::new();
    encode_batch_exist_key(
        &mut out,
        7,
        &["k1", "k2"],
        Some("default"),
        TypeLiteral::Include,
    )
    .unwrap();
    assert_eq!(out, hex(BATCH_REQUEST_2_KEYS));
}

#[test]
fn batch_exist_key_request_release_form() {
    let mut out = Vec::new();
    encode_batch_exist_key(
        &mut out,
        7,
        &["k1", "k2"],
        Some("default"),
        TypeLiteral::Omit,
    )
    .unwrap();
    let header = RequestHeader::decode(&out).unwrap();
    assert_eq!(header.body_length, 0x13);
    assert_eq!(
        out[REQUEST_HEADER_LEN..],
        hex("628df700 02 026b31 026b32 07 64656661756c74")[..]
    );
}

#[test]
fn batch_exist_key_request_of_1000_keys_uses_2_byte_lengths() {
    let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
    let mut out = Vec::new();
    encode_batch_exist_key(&mut out, 1, &keys, Some("default"), TypeLiteral::Include).unwrap();
    let body = &out[REQUEST_HEADER_LEN..];
    assert_eq!(body[..4], hex("63 8d f7 00")[..]);
    assert_eq!(body[4], 0x0c, "metainfo: literal + 2-byte lengths");
    assert_eq!(body[5..13], hex("fd 84 80 0c 80 0c ff 00")[..]);
    assert_eq!(body[13..15], [0xe8, 0x03], "1,000 keys");
    assert_eq!(
        body[15..19],
        [0x02, 0x00, b'k', b'0'],
        "every length takes 2 bytes"
    );
    // The release form still needs the metainfo byte for the width.
    let mut release = Vec::new();
    encode_batch_exist_key(&mut release, 1, &keys, Some("default"), TypeLiteral::Omit).unwrap();
    assert_eq!(
        release[REQUEST_HEADER_LEN..REQUEST_HEADER_LEN + 7],
        hex("63 8d f7 00 08 e8 03")[..]
    );
    // A fake master reads back exactly what was sent, in both forms.
    for frame in [&out, &release] {
        let args = decode_batch_exist_key_args(&frame[REQUEST_HEADER_LEN..]).unwrap();
        assert_eq!(args.keys, keys);
        assert_eq!(args.tenant_id.as_deref(), Some("default"));
    }
}

#[test]
fn one_long_key_widens_every_length() {
    let keys = ["a".repeat(300), "b".to_owned()];
    let mut out = Vec::new();
    encode_batch_exist_key(&mut out, 1, &keys, Some("t"), TypeLiteral::Omit).unwrap();
    let body = &out[REQUEST_HEADER_LEN..];
    assert_eq!(body[4], 0x08);
    assert_eq!(body[5..9], [0x02, 0x00, 0x2c, 0x01], "count 2, then 300");
    let args = decode_batch_exist_key_args(body).unwrap();
    assert_eq!(args.keys, keys);
    assert_eq!(args.tenant_id.as_deref(), Some("t"));
}

#[test]
fn one_argument_batch_exist_key_is_the_bare_vector() {
    let mut out = Vec::new();
    encode_batch_exist_key(&mut out, 1, &["k1", "k2"], None, TypeLiteral::Omit).unwrap();
    assert_eq!(
        out[REQUEST_HEADER_LEN..],
        hex("1ae1868a 02 026b31 026b32")[..]
    );
    let mut debug = Vec::new();
    encode_batch_exist_key(&mut debug, 1, &["k1", "k2"], None, TypeLiteral::Include).unwrap();
    assert_eq!(
        debug[REQUEST_HEADER_LEN..],
        hex("1be1868a 04 84800c00 02 026b31 026b32")[..]
    );
    let args = decode_batch_exist_key_args(&out[REQUEST_HEADER_LEN..]).unwrap();
    assert_eq!((args.keys.len(), args.tenant_id), (2, None));
}

#[test]
fn exist_key_requests_both_signatures() {
    let mut out = Vec::new();
    encode_exist_key(&mut out, 5, "k1", Some("default"), TypeLiteral::Omit).unwrap();
    assert_eq!(
        out,
        hex("15000000 05000000 095f3889 0f000000 00000000  d81ef97c 02 6b31 07 64656661756c74")
    );
    let args = decode_exist_key_args(&out[REQUEST_HEADER_LEN..]).unwrap();
    assert_eq!(
        (args.keys.as_str(), args.tenant_id.as_deref()),
        ("k1", Some("default"))
    );
    out.clear();
    encode_exist_key(&mut out, 5, "k1", None, TypeLiteral::Include).unwrap();
    assert_eq!(
        out[REQUEST_HEADER_LEN..],
        hex("77facf9d 04 800c00 02 6b31")[..]
    );
    let args = decode_exist_key_args(&out[REQUEST_HEADER_LEN..]).unwrap();
    assert_eq!((args.keys.as_str(), args.tenant_id), ("k1", None));
}

#[test]
fn service_ready_request_has_an_empty_body() {
    let mut out = Vec::new();
    encode_service_ready(&mut out, 3);
    assert_eq!(out, hex("15000000 03000000 56bb817b 00000000 00000000"));
}

#[test]
fn raw_request_carries_any_function_id() {
    let mut out = Vec::new();
    encode_raw(&mut out, 2, FunctionId(0x1234_5678), &[0xaa]).unwrap();
    assert_eq!(out, hex("15000000 02000000 78563412 01000000 00000000 aa"));
}

const BATCH_REPLY_2_KEYS: &str = "
    15 00 00 00  07 00 00 00  0f 00 00 00  00 00 00 00
    5d 8c 5f 2a  04  84 87 0b 01 00  02  01 01  01 00";

#[test]
fn batch_exist_key_reply_from_the_real_master() {
    let frame = hex(BATCH_REPLY_2_KEYS);
    let header = ReplyHeader::decode(&frame).unwrap();
    assert_eq!(
        header,
        ReplyHeader {
            err_code: 0,
            msg_type: 0,
            seq_num: 7,
            body_length: 15,
            attach_length: 0
        }
    );
    let body = &frame[REPLY_HEADER_LEN..];
    assert_eq!(body.len(), 15);
    assert_eq!(
        decode_batch_exist_key_reply(body).unwrap(),
        vec![Ok(true), Ok(false)]
    );
    let mut again = Vec::new();
    encode_batch_exist_key_reply(&mut again, 7, &[Ok(true), Ok(false)], TypeLiteral::Include);
    assert_eq!(again, frame);
}

#[test]
fn batch_exist_key_reply_of_3_keys() {
    let body = hex("5d8c5f2a 04 84870b0100 03 0101 0100 0101");
    assert_eq!(
        decode_batch_exist_key_reply(&body).unwrap(),
        vec![Ok(true), Ok(false), Ok(true)]
    );
}

#[test]
fn batch_exist_key_reply_release_form_and_errors() {
    // Release form: no metainfo, no literal; an ErrorCode entry is has_value 0 + i32.
    let body = hex("5c8c5f2a 03 0101 00 40fdffff 0100");
    assert_eq!(
        decode_batch_exist_key_reply(&body).unwrap(),
        vec![Ok(true), Err(StoreErrorCode::OBJECT_NOT_FOUND), Ok(false)]
    );
    let mut again = Vec::new();
    encode_batch_exist_key_reply(
        &mut again,
        1,
        &[Ok(true), Err(StoreErrorCode(-704)), Ok(false)],
        TypeLiteral::Omit,
    );
    assert_eq!(again[REPLY_HEADER_LEN..], body[..]);
}

#[test]
fn batch_exist_key_reply_of_1000_keys_uses_2_byte_count() {
    let answers: Vec<ExistResult> = (0..1000).map(|i| Ok(i % 3 == 0)).collect();
    let mut frame = Vec::new();
    encode_batch_exist_key_reply(&mut frame, 9, &answers, TypeLiteral::Include);
    let body = &frame[REPLY_HEADER_LEN..];
    assert_eq!(body[..12], hex("5d8c5f2a 0c 84870b0100 e803")[..]);
    assert_eq!(decode_batch_exist_key_reply(body).unwrap(), answers);
}

#[test]
fn empty_batch_exist_key_reply_from_the_real_master() {
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5d8c5f2a 04 84870b0100 00")).unwrap(),
        Vec::<ExistResult>::new()
    );
}

#[test]
fn exist_key_and_service_ready_replies_from_the_real_master() {
    assert_eq!(
        decode_exist_key_reply(&hex("d300e890 04 870b0100 01 00")).unwrap(),
        Ok(false)
    );
    assert_eq!(
        decode_exist_key_reply(&hex("d200e890 01 01")).unwrap(),
        Ok(true)
    );
    assert_eq!(
        decode_exist_key_reply(&hex("d200e890 00 a8fdffff")).unwrap(),
        Err(StoreErrorCode::INVALID_PARAMS)
    );
    let ready = hex("35ccb31c 04 87800c0100 01 05 322e302e30");
    assert_eq!(
        decode_service_ready_reply(&ready).unwrap(),
        Ok("2.0.0".to_owned())
    );
    let mut again = Vec::new();
    encode_service_ready_reply(&mut again, 3, Ok("2.0.0"), TypeLiteral::Include);
    assert_eq!(again[REPLY_HEADER_LEN..], ready[..]);
    assert_eq!(
        decode_service_ready_reply(&hex("34ccb31c 00 ffffffff")).unwrap(),
        Err(StoreErrorCode::INTERNAL_ERROR)
    );
}

#[test]
fn err_code_4_reply_from_the_real_master() {
    // The one-argument BatchExistKey sent to 0.3.13.
    let frame = hex("15 00 04 00 01 00 00 00 18 00 00 00 00 00 00 00
         77 fa cf 9d 04 80 0c 00 0f 69 6e 76 61 6c 69 64 20 72 70 63 20 61 72 67");
    let header = ReplyHeader::decode(&frame).unwrap();
    assert_eq!(
        (header.err_code, header.seq_num, header.body_length),
        (4, 1, 0x18)
    );
    let err = decode_error_reply(header.err_code, &frame[REPLY_HEADER_LEN..]).unwrap();
    assert_eq!(
        err,
        RpcError {
            code: 4,
            message: "invalid rpc arg".to_owned()
        }
    );
    let mut again = Vec::new();
    encode_error_reply(&mut again, 1, 4, "invalid rpc arg", TypeLiteral::Include);
    assert_eq!(again, frame);
}

#[test]
fn err_code_11_reply_from_the_real_master() {
    let frame = hex("15 00 0b 00 02 00 00 00 28 00 00 00 00 00 00 00
         77 fa cf 9d 04 80 0c 00 1f");
    let mut frame = frame;
    frame.extend_from_slice(b"the rpc function not registered");
    let header = ReplyHeader::decode(&frame).unwrap();
    assert_eq!(header.err_code, ERR_FUNCTION_NOT_REGISTERED);
    let err = decode_error_reply(header.err_code, &frame[REPLY_HEADER_LEN..]).unwrap();
    assert_eq!(err.code, 11);
    assert_eq!(err.message, "the rpc function not registered");
}

#[test]
fn err_code_255_carries_a_16_bit_code() {
    let mut frame = Vec::new();
    encode_error_reply(&mut frame, 4, 1001, "too large", TypeLiteral::Omit);
    let header = ReplyHeader::decode(&frame).unwrap();
    assert_eq!(header.err_code, ERR_EXTENDED);
    assert_eq!(
        frame[REPLY_HEADER_LEN..],
        hex("4ce62b37 e903 09 746f6f206c61726765")[..]
    );
    let err = decode_error_reply(header.err_code, &frame[REPLY_HEADER_LEN..]).unwrap();
    assert_eq!(
        err,
        RpcError {
            code: 1001,
            message: "too large".to_owned()
        }
    );
}

#[test]
fn headers_reject_bad_magic_version_and_short_input() {
    let mut frame = hex(BATCH_REPLY_2_KEYS);
    assert_eq!(
        ReplyHeader::decode(&frame[..15]),
        Err(CodecError::Truncated {
            needed: 16,
            remaining: 15
        })
    );
    frame[1] = 1;
    assert_eq!(
        ReplyHeader::decode(&frame),
        Err(CodecError::UnsupportedVersion(1))
    );
    frame[0] = 0x16;
    assert_eq!(ReplyHeader::decode(&frame), Err(CodecError::BadMagic(0x16)));
    let mut request = hex(BATCH_REQUEST_2_KEYS);
    request[2] = 1;
    assert_eq!(
        RequestHeader::decode(&request),
        Err(CodecError::UnsupportedSerializeType(1))
    );
}

#[test]
fn reply_decoders_give_typed_errors_on_malformed_bodies() {
    let body = hex("5d8c5f2a 04 84870b0100 02 0101 0100");
    // Every cut is an error, never a panic.
    for cut in 0..body.len() {
        assert!(
            decode_batch_exist_key_reply(&body[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    assert_eq!(
        decode_batch_exist_key_reply(&body[..14]),
        Err(CodecError::Truncated {
            needed: 4,
            remaining: 3
        })
    );
    // A count far beyond the bytes left is refused before allocating.
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5d8c5f2a 18 ffffffffffffffff 01")),
        Err(CodecError::LengthOverflow { length: u64::MAX })
    );
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5d8c5f2a 10 ffffff00 0101")),
        Err(CodecError::Truncated {
            needed: 2 * 0x00ff_ffff,
            remaining: 2
        })
    );
    // Another type: ExistKey's reply where BatchExistKey's is expected.
    assert_eq!(
        decode_batch_exist_key_reply(&hex("d200e890 01 01")),
        Err(CodecError::TypeHashMismatch {
            expected: 0x2a5f_8c5c,
            got: 0x90e8_00d2
        })
    );
    // The right hash with the wrong literal.
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5d8c5f2a 04 84870b0200 00")),
        Err(CodecError::TypeLiteralMismatch {
            expected: &[0x84, 0x87, 0x0b, 0x01],
            got: vec![0x84, 0x87, 0x0b, 0x02]
        })
    );
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5d8c5f2a 04 84870b01")),
        Err(CodecError::UnterminatedTypeLiteral)
    );
    // Reserved metainfo bits are refused; bits 0-1 announce a total size.
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5d8c5f2a 20 00")),
        Err(CodecError::UnsupportedMetainfo(0x20))
    );
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5d8c5f2a 01 00")),
        Err(CodecError::Truncated {
            needed: 2,
            remaining: 1
        })
    );
    // A total size that holds the data: the known fields, then skipped extras.
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5d8c5f2a 01 0d00 01 0101 00 abcd")),
        Ok(vec![Ok(true)])
    );
    assert_eq!(
        decode_batch_exist_key_reply(&hex("5c8c5f2a 01 0101 00")),
        Err(CodecError::TrailingBytes { count: 1 })
    );
    assert_eq!(
        decode_error_reply(4, &hex("76facf9d 05 6162")),
        Err(CodecError::Truncated {
            needed: 5,
            remaining: 2
        })
    );
}

#[test]
fn metainfo_flag_bit_is_ignored_when_comparing_hashes() {
    // Bit 0 set with a zero metainfo byte: the default configuration spelled out.
    assert_eq!(
        decode_exist_key_reply(&hex("d300e890 00 01 01")).unwrap(),
        Ok(true)
    );
}

// `remove_all(True)` and `remove_all()` of the PyPI client (0.3.13.post1), captured
// between it and the real master: 3 objects removed, then 1, then 0.
const REMOVE_ALL_FORCE_REQUEST: &str = "
    15 00 00 00  05 00 00 00  b0 ce 78 d9  14 00 00 00  00 00 00 00
    75 c2 a6 48  04  fd 0b 80 0c ff 00  01  07 64 65 66 61 75 6c 74";
const REMOVE_ALL_REQUEST: &str = "
    15 00 00 00  07 00 00 00  b0 ce 78 d9  14 00 00 00  00 00 00 00
    75 c2 a6 48  04  fd 0b 80 0c ff 00  00  07 64 65 66 61 75 6c 74";
const REMOVE_ALL_REPLY_3: &str = "
    15 00 00 00  05 00 00 00  0f 00 00 00  00 00 00 00
    35 68 66 86  04  03 00  03 00 00 00 00 00 00 00";

#[test]
fn remove_all_requests_match_the_real_client() {
    for (force, seq, golden) in [
        (true, 5, REMOVE_ALL_FORCE_REQUEST),
        (false, 7, REMOVE_ALL_REQUEST),
    ] {
        let mut out = Vec::new();
        encode_remove_all(&mut out, seq, force, Some("default"), TypeLiteral::Include).unwrap();
        assert_eq!(out, hex(golden), "force={force}");
        let args = decode_remove_all_args(&out[REQUEST_HEADER_LEN..]).unwrap();
        assert_eq!(
            args,
            RemoveAllArgs {
                force,
                tenant_id: Some("default".to_owned())
            }
        );
    }
    // Release form, and the pre-0.3.12 bare bool.
    let mut out = Vec::new();
    encode_remove_all(&mut out, 1, true, Some("default"), TypeLiteral::Omit).unwrap();
    assert_eq!(
        out[REQUEST_HEADER_LEN..],
        hex("74c2a648 01 07 64656661756c74")[..]
    );
    out.clear();
    encode_remove_all(&mut out, 1, true, None, TypeLiteral::Omit).unwrap();
    assert_eq!(out[REQUEST_HEADER_LEN..], hex("d8ffc813 01")[..]);
    assert_eq!(
        decode_remove_all_args(&out[REQUEST_HEADER_LEN..]).unwrap(),
        RemoveAllArgs {
            force: true,
            tenant_id: None
        }
    );
}

#[test]
fn remove_all_replies_from_the_real_master() {
    let frame = hex(REMOVE_ALL_REPLY_3);
    let header = ReplyHeader::decode(&frame).unwrap();
    assert_eq!(
        (header.err_code, header.seq_num, header.body_length),
        (0, 5, 15)
    );
    assert_eq!(decode_remove_all_reply(&frame[REPLY_HEADER_LEN..]), Ok(3));
    assert_eq!(
        decode_remove_all_reply(&hex("35686686 04 0300 0100000000000000")),
        Ok(1)
    );
    assert_eq!(
        decode_remove_all_reply(&hex("35686686 04 0300 0000000000000000")),
        Ok(0)
    );
    let mut again = Vec::new();
    encode_remove_all_reply(&mut again, 5, 3, TypeLiteral::Include);
    assert_eq!(again, frame);
    // Release form, and bodies that are not a long.
    assert_eq!(
        decode_remove_all_reply(&hex("34686686 ffffffffffffffff")),
        Ok(-1)
    );
    assert_eq!(
        decode_remove_all_reply(&hex("34686686 0300")),
        Err(CodecError::Truncated {
            needed: 8,
            remaining: 2
        })
    );
    assert_eq!(
        decode_remove_all_reply(&hex("d200e890 01 01")),
        Err(CodecError::TypeHashMismatch {
            expected: 0x8666_6834,
            got: 0x90e8_00d2
        })
    );
}
