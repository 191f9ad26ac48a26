//! `GetReplicaList` on the wire, pinned to bytes captured from the real master (PyPI
//! `mooncake-transfer-engine-non-cuda==0.3.13.post1`, started with
//! `-default_kv_lease_ttl=5000`, one key written by the Python client over tcp): the
//! request, the reply for a present key (one memory replica, lease 5,000 ms, no
//! checksum) and for a missing key (`-704`). `spec/mooncake-master-rpc.md`, "Where the
//! lease can be read".

use mooncake_master::StoreErrorCode;
use mooncake_master::codec::{
    self, BufferDescriptor, CodecError, FunctionId, REQUEST_HEADER_LEN, ReplicaDescriptor,
    ReplicaList, ReplicaLocation, RequestHeader, TypeLiteral,
};

/// The reply's type hash (metainfo bit set), metainfo (literal included) and literal.
const PROLOGUE: [u8; 65] = [
    0x6d, 0x27, 0xc6, 0x88, 0x04, 0x87, 0xfd, 0x84, 0xfd, 0x04, 0x86, 0xfd, 0xfd, 0x04, 0x04, 0x80,
    0x0c, 0x80, 0x0c, 0xff, 0xff, 0xfd, 0xfd, 0x04, 0x04, 0x80, 0x0c, 0x80, 0x0c, 0xff, 0xff, 0xfd,
    0x80, 0x0c, 0x04, 0xff, 0xfd, 0xfd, 0x04, 0x04, 0x89, 0x89, 0xff, 0x04, 0x80, 0x0c, 0xff, 0xfd,
    0x80, 0x0c, 0x04, 0x04, 0x04, 0x01, 0xff, 0xff, 0x01, 0xff, 0x04, 0x85, 0x04, 0xff, 0x01, 0x00,
    0x01,
];

/// Data of the present key's reply, after the prologue's `has_value` byte.
const PRESENT: [u8; 59] = [
    0x01, // one replica
    0x01, 0, 0, 0, 0, 0, 0, 0,    // id 1
    0x00, // memory
    0x01, 0, 0, 0, 0, 0, 0, 0, // size 1
    0, 0, 0, 0x1b, 0xd2, 0x7f, 0, 0, // buffer address
    0x03, b't', b'c', b'p', // protocol
    0x0f, b'1', b'2', b'7', b'.', b'0', b'.', b'0', b'.', b'1', b':', b'1', b'6', b'6', b'7',
    b'6', // transport endpoint
    0x03, 0, 0, 0, // status: complete
    0x88, 0x13, 0, 0, 0, 0, 0, 0,    // lease_ttl_ms 5000
    0x00, // no checksum
];

fn present_reply() -> Vec<u8> {
    [&PROLOGUE[..], &PRESENT[..]].concat()
}

fn present_list() -> ReplicaList {
    ReplicaList {
        replicas: vec![ReplicaDescriptor {
            id: 1,
            location: ReplicaLocation::Memory(BufferDescriptor {
                size: 1,
                buffer_address: 0x7fd2_1b00_0000,
                protocol: "tcp".to_owned(),
                transport_endpoint: "127.0.0.1:16676".to_owned(),
            }),
            status: 3,
        }],
        lease_ttl_ms: 5000,
        object_checksum: None,
    }
}

#[test]
fn the_request_is_exist_keys_arguments_under_its_own_function_id() {
    let mut frame = Vec::new();
    codec::encode_get_replica_list(
        &mut frame,
        1,
        "k-one",
        Some("default"),
        TypeLiteral::Include,
    )
    .unwrap();
    let header = RequestHeader::decode(&frame).unwrap();
    assert_eq!(header.function_id, FunctionId::GET_REPLICA_LIST);
    assert_eq!(header.function_id.0, 0x1f7e_f174);
    assert_eq!(
        frame[REQUEST_HEADER_LEN..],
        [
            0xd9, 0x1e, 0xf9, 0x7c, 0x04, 0xfd, 0x80, 0x0c, 0x80, 0x0c, 0xff, 0x00, 0x05, b'k',
            b'-', b'o', b'n', b'e', 0x07, b'd', b'e', b'f', b'a', b'u', b'l', b't'
        ]
    );
    let mut release = Vec::new();
    codec::encode_get_replica_list(&mut release, 1, "k-one", Some("default"), TypeLiteral::Omit)
        .unwrap();
    assert_eq!(
        release[REQUEST_HEADER_LEN..],
        [
            0xd8, 0x1e, 0xf9, 0x7c, 0x05, b'k', b'-', b'o', b'n', b'e', 0x07, b'd', b'e', b'f',
            b'a', b'u', b'l', b't'
        ]
    );
}

#[test]
fn the_real_masters_reply_gives_its_lease() {
    let list = codec::decode_get_replica_list_reply(&present_reply())
        .unwrap()
        .unwrap();
    assert_eq!(list, present_list());
}

#[test]
fn a_missing_key_is_the_masters_object_not_found() {
    let reply = [
        &PROLOGUE[..PROLOGUE.len() - 1],
        &[0x00, 0x40, 0xfd, 0xff, 0xff],
    ]
    .concat();
    assert_eq!(
        codec::decode_get_replica_list_reply(&reply).unwrap(),
        Err(StoreErrorCode(-704))
    );
}

#[test]
fn the_encoder_writes_the_captured_bytes_and_round_trips_every_field() {
    let mut frame = Vec::new();
    codec::encode_get_replica_list_reply(&mut frame, 9, &Ok(present_list()), TypeLiteral::Include);
    assert_eq!(frame[16..], present_reply()[..]);
    let mut list = present_list();
    list.object_checksum = Some(0x0102_0304_0506_0708);
    list.replicas.push(ReplicaDescriptor {
        id: 2,
        location: ReplicaLocation::Disk {
            file_path: "/ssd/objects/k".to_owned(),
            object_size: 4096,
        },
        status: 3,
    });
    list.replicas.push(ReplicaDescriptor {
        id: 3,
        location: ReplicaLocation::NoF(BufferDescriptor {
            size: 4096,
            buffer_address: 0,
            protocol: "rdma".to_owned(),
            transport_endpoint: "10.0.0.2:1".to_owned(),
        }),
        status: 1,
    });
    for literal in [TypeLiteral::Include, TypeLiteral::Omit] {
        let mut frame = Vec::new();
        codec::encode_get_replica_list_reply(&mut frame, 9, &Ok(list.clone()), literal);
        assert_eq!(
            codec::decode_get_replica_list_reply(&frame[16..]).unwrap(),
            Ok(list.clone())
        );
    }
}

#[test]
fn unknown_replica_kinds_truncation_and_other_types_are_refused() {
    let mut local_disk = present_reply();
    local_disk[PROLOGUE.len() + 9] = 3;
    assert_eq!(
        codec::decode_get_replica_list_reply(&local_disk),
        Err(CodecError::UnsupportedReplicaKind(3))
    );
    let reply = present_reply();
    assert_eq!(
        codec::decode_get_replica_list_reply(&reply[..reply.len() - 1]),
        Err(CodecError::Truncated {
            needed: 1,
            remaining: 0
        })
    );
    let trailing = [&reply[..], &[0]].concat();
    assert_eq!(
        codec::decode_get_replica_list_reply(&trailing),
        Err(CodecError::TrailingBytes { count: 1 })
    );
    // An ExistKey reply (expected<bool, ErrorCode>) is not a replica list.
    let mut exist = Vec::new();
    codec::encode_exist_key_reply(&mut exist, 1, Ok(true), TypeLiteral::Omit);
    assert_eq!(
        codec::decode_get_replica_list_reply(&exist[16..]),
        Err(CodecError::TypeHashMismatch {
            expected: 0x88c6_276c,
            got: 0x90e8_00d2,
        })
    );
    // A replica count the bytes cannot hold is refused before allocating.
    let mut huge = present_reply();
    huge[PROLOGUE.len()] = 0xff;
    assert_eq!(
        codec::decode_get_replica_list_reply(&huge),
        Err(CodecError::Truncated {
            needed: 255 * 22,
            remaining: PRESENT.len() - 1,
        })
    );
}
