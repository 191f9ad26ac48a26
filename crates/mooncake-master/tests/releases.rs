//! The codec against bytes captured from the real masters of the other releases users
//! run (`spec/mooncake-master-rpc.md`, "Master releases"): PyPI
//! `mooncake-transfer-engine-non-cuda==0.3.10` and `mooncake-transfer-engine-cuda13==0.3.14`
//! (its master runs without a GPU), each started with `-default_kv_lease_ttl=5000`,
//! one key `cap-key-1` written by a Python client over tcp (0.3.10's own; the pinned
//! 0.3.13.post1 one for 0.3.14). Every master reports `2.0.0` in `ServiceReady`, so
//! only the replies' shapes tell the releases apart.

use mooncake_master::StoreErrorCode;
use mooncake_master::codec::{
    self, BufferDescriptor, CodecError, ReplicaDescriptor, ReplicaList, ReplicaListLayout,
    ReplicaLocation, TypeLiteral,
};

fn hex(text: &str) -> Vec<u8> {
    let text: String = text.split_whitespace().collect();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// 0.3.10's `GetReplicaList` reply prologue: hash `0x8362cb40` (metainfo bit set),
/// metainfo `04` (literal), the literal and its NUL.
const PROLOGUE_0_3_10: &str =
    "41cb6283 04 87fd84fd0486fdfd0404800c800cfffffd800c04fffdfd04048989ff04800cffff01ff04ff01 00";

/// 0.3.14's prologue: 0.3.13's hash and literal, metainfo `05` (literal, and a 2-byte
/// total size for its `compatible` fields) and the size (`SIZE` stands for it).
const PROLOGUE_0_3_14: &str = "6d27c688 05 SIZE 87fd84fd0486fdfd0404800c800cfffffdfd0404800c800cfffffd800c04fffdfd04048989ff04800cfffd800c04040401ffff01ff048504ff01 00";

fn memory_replica(id: u64, address: u64, port: u16) -> ReplicaDescriptor {
    ReplicaDescriptor {
        id,
        location: ReplicaLocation::Memory(BufferDescriptor {
            size: 1,
            buffer_address: address,
            protocol: "tcp".to_owned(),
            transport_endpoint: format!("127.0.0.1:{port}"),
        }),
        status: 3,
    }
}

#[test]
fn the_0_3_10_master_reports_its_lease_in_its_own_layout() {
    let present = hex(&format!(
        "{PROLOGUE_0_3_10} 01 01 0200000000000000 00 0100000000000000 0000004b977f0000 \
         03 746370 0f 3132372e302e302e313a3136353435 03000000 8813000000000000"
    ));
    let (result, layout) = codec::decode_get_replica_list_reply_layout(&present).unwrap();
    assert_eq!(layout, ReplicaListLayout::V0_3_10);
    assert_eq!(
        result,
        Ok(ReplicaList {
            replicas: vec![memory_replica(2, 0x7f97_4b00_0000, 16545)],
            lease_ttl_ms: 5000,
            object_checksum: None,
        })
    );
    let missing = hex(&format!("{PROLOGUE_0_3_10} 00 40fdffff"));
    assert_eq!(
        codec::decode_get_replica_list_reply(&missing).unwrap(),
        Err(StoreErrorCode(-704))
    );
    // The fake masters' encoder writes the same bytes back.
    let mut frame = Vec::new();
    codec::encode_get_replica_list_reply_in(
        &mut frame,
        3,
        &result,
        TypeLiteral::Include,
        ReplicaListLayout::V0_3_10,
    )
    .unwrap();
    assert_eq!(frame[16..], present[..]);
}

#[test]
fn on_0_3_10_disk_is_kind_1_and_local_disk_is_refused() {
    let list = ReplicaList {
        replicas: vec![ReplicaDescriptor {
            id: 7,
            location: ReplicaLocation::Disk {
                file_path: "/ssd/k".to_owned(),
                object_size: 4096,
            },
            status: 3,
        }],
        lease_ttl_ms: 10_000,
        object_checksum: Some(9),
    };
    let mut frame = Vec::new();
    codec::encode_get_replica_list_reply_in(
        &mut frame,
        1,
        &Ok(list.clone()),
        TypeLiteral::Omit,
        ReplicaListLayout::V0_3_10,
    )
    .unwrap();
    // hash, has_value, count, id, then the variant index: disk is 1 on 0.3.10.
    assert_eq!(frame[16 + 4 + 1 + 1 + 8], 1);
    let decoded = codec::decode_get_replica_list_reply(&frame[16..]).unwrap();
    // The layout has no checksum: the one given is not sent.
    assert_eq!(
        decoded,
        Ok(ReplicaList {
            object_checksum: None,
            ..list
        })
    );
    frame[16 + 4 + 1 + 1 + 8] = 2;
    assert_eq!(
        codec::decode_get_replica_list_reply(&frame[16..]),
        Err(CodecError::UnsupportedReplicaKind(2))
    );
    let nof = ReplicaList {
        replicas: vec![ReplicaDescriptor {
            id: 1,
            location: ReplicaLocation::NoF(BufferDescriptor {
                size: 1,
                buffer_address: 0,
                protocol: "rdma".to_owned(),
                transport_endpoint: "h:1".to_owned(),
            }),
            status: 3,
        }],
        lease_ttl_ms: 1,
        object_checksum: None,
    };
    let mut out = Vec::new();
    assert_eq!(
        codec::encode_get_replica_list_reply_in(
            &mut out,
            1,
            &Ok(nof),
            TypeLiteral::Omit,
            ReplicaListLayout::V0_3_10
        ),
        Err(CodecError::UnsupportedReplicaKind(1))
    );
    assert!(out.is_empty(), "nothing appended: {out:02x?}");
}

#[test]
fn the_0_3_14_master_appends_compatible_fields_that_are_skipped() {
    let present = hex(&(PROLOGUE_0_3_14.replace("SIZE", "8800")
        + " 01 01 0100000000000000 00 0100000000000000 00000088357f0000 03 746370 \
           0f 3132372e302e302e313a3135333130 03000000 8813000000000000 00 \
           00 01 07 64656661756c74"));
    assert_eq!(present.len(), 0x88, "the size covers the whole body");
    let (result, layout) = codec::decode_get_replica_list_reply_layout(&present).unwrap();
    assert_eq!(layout, ReplicaListLayout::V0_3_13);
    assert_eq!(
        result,
        Ok(ReplicaList {
            replicas: vec![memory_replica(1, 0x7f35_8800_0000, 15310)],
            lease_ttl_ms: 5000,
            object_checksum: None,
        })
    );
    let missing = hex(&(PROLOGUE_0_3_14.replace("SIZE", "4700") + " 00 40fdffff"));
    assert_eq!(missing.len(), 0x47);
    assert_eq!(
        codec::decode_get_replica_list_reply(&missing).unwrap(),
        Err(StoreErrorCode(-704))
    );
    // A declared size that is not the body's is refused either way.
    let cut = &present[..present.len() - 1];
    assert_eq!(
        codec::decode_get_replica_list_reply(cut),
        Err(CodecError::Truncated {
            needed: 1,
            remaining: 0
        })
    );
    let long = [&present[..], &[0]].concat();
    assert_eq!(
        codec::decode_get_replica_list_reply(&long),
        Err(CodecError::TrailingBytes { count: 1 })
    );
}

#[test]
fn batch_exist_key_answers_hits_and_misses_on_both_releases() {
    // 0.3.10 takes the bare key list and refuses the tenant form with err_code 4.
    let mut legacy = Vec::new();
    codec::encode_batch_exist_key(
        &mut legacy,
        9,
        &["cap-key-1", "absent-key", "cap-key-1"],
        None,
        TypeLiteral::Include,
    )
    .unwrap();
    assert_eq!(
        legacy[20..],
        hex(
            "1be1868a 04 84800c00 03 09 6361702d6b65792d31 0a 616273656e742d6b6579 \
             09 6361702d6b65792d31"
        )[..]
    );
    let mut tenant = Vec::new();
    codec::encode_batch_exist_key(
        &mut tenant,
        8,
        &["cap-key-1", "absent-key", "cap-key-1"],
        Some("default"),
        TypeLiteral::Include,
    )
    .unwrap();
    assert_eq!(
        tenant[20..],
        hex(
            "638df700 04 fd84800c800cff00 03 09 6361702d6b65792d31 0a 616273656e742d6b6579 \
             09 6361702d6b65792d31 07 64656661756c74"
        )[..]
    );
    // Both masters answer [true, false, true] in the same bytes.
    let reply = hex("5d8c5f2a 04 84870b0100 03 0101 0100 0101");
    assert_eq!(
        codec::decode_batch_exist_key_reply(&reply).unwrap(),
        vec![Ok(true), Ok(false), Ok(true)]
    );
    // The refusals differ in their message only.
    for (message, text) in [
        ("0f 696e76616c69642072706320617267", "invalid rpc arg"),
        (
            "1e 696e76616c6964207270632066756e6374696f6e20617267756d656e7473",
            "invalid rpc function arguments",
        ),
    ] {
        let body = hex(&format!("77facf9d 04 800c00 {message}"));
        let error = codec::decode_error_reply(codec::ERR_INVALID_ARGUMENTS, &body).unwrap();
        assert_eq!(error.message, text);
    }
    // ServiceReady: "2.0.0" from every release.
    let ready = hex("35ccb31c 04 87800c01 00 01 05 322e302e30");
    assert_eq!(
        codec::decode_service_ready_reply(&ready).unwrap(),
        Ok("2.0.0".to_owned())
    );
}
