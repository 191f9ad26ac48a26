//! The master's existence RPC (and `RemoveAll`, `GetReplicaList`) on the wire, without I/O (`spec/mooncake-master-rpc.md`).
//!
//! A call is a coro_rpc frame: a 20-byte [`RequestHeader`] (sequence number, function
//! id, body length) and a struct_pack body holding the arguments; the answer is a
//! 16-byte [`ReplyHeader`] (echoed sequence number, `err_code`) and a struct_pack body
//! holding the return value, or an error message when `err_code != 0`.
//!
//! - Client side: [`encode_batch_exist_key`], [`encode_exist_key`],
//!   [`encode_service_ready`], [`encode_remove_all`], [`encode_get_replica_list`],
//!   [`encode_raw`];
//!   [`decode_batch_exist_key_reply`], [`decode_exist_key_reply`],
//!   [`decode_service_ready_reply`], [`decode_remove_all_reply`],
//!   [`decode_get_replica_list_reply`] (the read lease, in the layout of 0.3.10 or of
//!   0.3.13 and 0.3.14: [`decode_get_replica_list_reply_layout`]),
//!   [`decode_error_reply`].
//! - Server side (fake masters in tests): [`decode_batch_exist_key_args`],
//!   [`decode_exist_key_args`], [`decode_remove_all_args`],
//!   [`encode_batch_exist_key_reply`], [`encode_exist_key_reply`],
//!   [`encode_service_ready_reply`], [`encode_remove_all_reply`],
//!   [`encode_get_replica_list_reply`] ([`encode_get_replica_list_reply_in`] for
//!   another [`ReplicaListLayout`]), [`encode_error_reply`].
//!
//! Decoders accept both the debug form (type literal included) and the release form,
//! skip the `compatible` fields a later master appends (struct_pack's total-size
//! metainfo, `spec/mooncake-master-rpc.md`, "Master releases"),
//! compare type hashes on bits 1-31 only, and answer malformed or truncated input with
//! a [`CodecError`]: they never panic and never allocate more than their input's size.
//!
//! ```
//! use mooncake_master::codec::{self, TypeLiteral, ReplyHeader, REPLY_HEADER_LEN};
//!
//! let mut frame = Vec::new();
//! codec::encode_batch_exist_key(&mut frame, 7, &["k1", "k2"], Some("default"), TypeLiteral::Include)?;
//! assert_eq!(&frame[..4], &[0x15, 0, 0, 0]);
//!
//! // The master's answer, captured: [true, false].
//! let reply = [
//!     0x15, 0, 0, 0, 7, 0, 0, 0, 0x0f, 0, 0, 0, 0, 0, 0, 0, // header
//!     0x5d, 0x8c, 0x5f, 0x2a, 0x04, 0x84, 0x87, 0x0b, 0x01, 0x00, 0x02, 1, 1, 1, 0,
//! ];
//! let header = ReplyHeader::decode(&reply)?;
//! assert_eq!((header.seq_num, header.err_code), (7, 0));
//! let found = codec::decode_batch_exist_key_reply(&reply[REPLY_HEADER_LEN..])?;
//! assert_eq!(found, vec![Ok(true), Ok(false)]);
//! # Ok::<(), codec::CodecError>(())
//! ```

mod header;
mod message;
mod pack;
mod replica;

pub use header::{
    MAGIC, REPLY_HEADER_LEN, REQUEST_HEADER_LEN, ReplyHeader, RequestHeader, SERIALIZE_STRUCT_PACK,
    VERSION,
};
pub use message::*;
pub use pack::TypeLiteral;
pub use replica::*;

use pack::PackType;

/// A coro_rpc function id: the first 4 bytes of the MD5 of the function's qualified
/// name, read big-endian; sent little-endian (`spec/mooncake-master-rpc.md`,
/// "Transport"). It depends on the name only, never on the signature, which is why an
/// argument change between master versions shows up as `err_code` 4, not 11.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FunctionId(pub u32);

impl FunctionId {
    /// `mooncake::WrappedMasterService::BatchExistKey`.
    pub const BATCH_EXIST_KEY: Self = Self(0xb89f_a6b0);
    /// `mooncake::WrappedMasterService::ExistKey`.
    pub const EXIST_KEY: Self = Self(0x8938_5f09);
    /// `mooncake::WrappedMasterService::ServiceReady`.
    pub const SERVICE_READY: Self = Self(0x7b81_bb56);
    /// `mooncake::WrappedMasterService::Ping` (takes arguments not modelled here).
    pub const PING: Self = Self(0xd6c2_dae5);
    /// `mooncake::WrappedMasterService::RemoveAll`.
    pub const REMOVE_ALL: Self = Self(0xd978_ceb0);
    /// `mooncake::WrappedMasterService::GetReplicaList` (the read lease, in its reply).
    pub const GET_REPLICA_LIST: Self = Self(0x1f7e_f174);

    /// The function's short name when it is one of the constants above.
    #[must_use]
    pub fn name(self) -> Option<&'static str> {
        match self {
            Self::BATCH_EXIST_KEY => Some("BatchExistKey"),
            Self::EXIST_KEY => Some("ExistKey"),
            Self::SERVICE_READY => Some("ServiceReady"),
            Self::PING => Some("Ping"),
            Self::REMOVE_ALL => Some("RemoveAll"),
            Self::GET_REPLICA_LIST => Some("GetReplicaList"),
            _ => None,
        }
    }
}

impl std::fmt::Display for FunctionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({:#010x})", self.0),
            None => write!(f, "{:#010x}", self.0),
        }
    }
}

/// The struct_pack types of the RPC: literal and hash (`spec/mooncake-master-rpc.md`,
/// the table in "struct_pack"). The hashes are `MD5_32(literal)` with bit 0 cleared;
/// a unit test recomputes each from its literal.
pub(crate) mod types {
    use super::PackType;

    /// `tuple<vector<string>, string>`: `BatchExistKey(keys, tenant_id)`, ≥ 0.3.12.
    pub(crate) const BATCH_EXIST_ARGS: PackType = PackType {
        literal: &[0xfd, 0x84, 0x80, 0x0c, 0x80, 0x0c, 0xff],
        hash: 0x00f7_8d62,
    };
    /// `vector<string>`: `BatchExistKey(keys)`, v0.3.5-v0.3.11, sent bare.
    pub(crate) const BATCH_EXIST_ARGS_LEGACY: PackType = PackType {
        literal: &[0x84, 0x80, 0x0c],
        hash: 0x8a86_e11a,
    };
    /// `tuple<string, string>`: `ExistKey(key, tenant_id)`, ≥ 0.3.12.
    pub(crate) const EXIST_ARGS: PackType = PackType {
        literal: &[0xfd, 0x80, 0x0c, 0x80, 0x0c, 0xff],
        hash: 0x7cf9_1ed8,
    };
    /// `string`: `ExistKey(key)` before tenants, and coro_rpc's error messages.
    pub(crate) const STRING: PackType = PackType {
        literal: &[0x80, 0x0c],
        hash: 0x9dcf_fa76,
    };
    /// `vector<expected<bool, ErrorCode>>`: the `BatchExistKey` reply.
    pub(crate) const BATCH_EXIST_REPLY: PackType = PackType {
        literal: &[0x84, 0x87, 0x0b, 0x01],
        hash: 0x2a5f_8c5c,
    };
    /// `expected<bool, ErrorCode>`: the `ExistKey` reply.
    pub(crate) const EXIST_REPLY: PackType = PackType {
        literal: &[0x87, 0x0b, 0x01],
        hash: 0x90e8_00d2,
    };
    /// `expected<string, ErrorCode>`: the `ServiceReady` reply (the master's version).
    pub(crate) const SERVICE_READY_REPLY: PackType = PackType {
        literal: &[0x87, 0x80, 0x0c, 0x01],
        hash: 0x1cb3_cc34,
    };
    /// `tuple<bool, string>`: `RemoveAll(force, tenant_id)`, ≥ 0.3.12.
    pub(crate) const REMOVE_ALL_ARGS: PackType = PackType {
        literal: &[0xfd, 0x0b, 0x80, 0x0c, 0xff],
        hash: 0x48a6_c274,
    };
    /// `bool`: `RemoveAll(force)` before tenants, sent bare.
    pub(crate) const BOOL: PackType = PackType {
        literal: &[0x0b],
        hash: 0x13c8_ffd8,
    };
    /// `long` (`int64_t`): the `RemoveAll` reply, the number of objects removed.
    pub(crate) const INT64: PackType = PackType {
        literal: &[0x03],
        hash: 0x8666_6834,
    };
    /// `expected<GetReplicaListResponse, ErrorCode>`: the `GetReplicaList` reply of
    /// 0.3.13 (`{ vector<Replica::Descriptor> replicas, uint64 lease_ttl_ms,
    /// optional<uint64> object_checksum }`; a descriptor is `{ uint64 id,
    /// variant<memory, NoF, disk, local disk, DFS descriptor>, ReplicaStatus }`),
    /// captured from the real master.
    pub(crate) const GET_REPLICA_LIST_REPLY: PackType = PackType {
        literal: &[
            0x87, 0xfd, 0x84, 0xfd, 0x04, 0x86, 0xfd, 0xfd, 0x04, 0x04, 0x80, 0x0c, 0x80, 0x0c,
            0xff, 0xff, 0xfd, 0xfd, 0x04, 0x04, 0x80, 0x0c, 0x80, 0x0c, 0xff, 0xff, 0xfd, 0x80,
            0x0c, 0x04, 0xff, 0xfd, 0xfd, 0x04, 0x04, 0x89, 0x89, 0xff, 0x04, 0x80, 0x0c, 0xff,
            0xfd, 0x80, 0x0c, 0x04, 0x04, 0x04, 0x01, 0xff, 0xff, 0x01, 0xff, 0x04, 0x85, 0x04,
            0xff, 0x01,
        ],
        hash: 0x88c6_276c,
    };
    /// `expected<GetReplicaListResponse, ErrorCode>` of 0.3.10 (`{ vector<Replica::
    /// Descriptor> replicas, uint64 lease_ttl_ms }`, no checksum; a descriptor's
    /// variant is `<memory, disk, local disk>`), captured from the real master of PyPI
    /// `mooncake-transfer-engine-non-cuda==0.3.10`.
    pub(crate) const GET_REPLICA_LIST_REPLY_0_3_10: PackType = PackType {
        literal: &[
            0x87, 0xfd, 0x84, 0xfd, 0x04, 0x86, 0xfd, 0xfd, 0x04, 0x04, 0x80, 0x0c, 0x80, 0x0c,
            0xff, 0xff, 0xfd, 0x80, 0x0c, 0x04, 0xff, 0xfd, 0xfd, 0x04, 0x04, 0x89, 0x89, 0xff,
            0x04, 0x80, 0x0c, 0xff, 0xff, 0x01, 0xff, 0x04, 0xff, 0x01,
        ],
        hash: 0x8362_cb40,
    };
    /// `pair<uint16_t, string_view>`: coro_rpc's body for `err_code` 255. Its literal
    /// is inferred from struct_pack's type codes (uint16 = 0x08), not captured, so
    /// receivers here do not check it.
    pub(crate) const ERROR_PAIR: PackType = PackType {
        literal: &[0xfd, 0x08, 0x80, 0x0c, 0xff],
        hash: 0x372b_e64c,
    };

    /// Every type above, for the test that recomputes the hashes.
    #[cfg(test)]
    pub(crate) const ALL: [PackType; 13] = [
        BATCH_EXIST_ARGS,
        BATCH_EXIST_ARGS_LEGACY,
        EXIST_ARGS,
        STRING,
        BATCH_EXIST_REPLY,
        EXIST_REPLY,
        SERVICE_READY_REPLY,
        REMOVE_ALL_ARGS,
        BOOL,
        INT64,
        ERROR_PAIR,
        GET_REPLICA_LIST_REPLY,
        GET_REPLICA_LIST_REPLY_0_3_10,
    ];
}

/// Why bytes could not be encoded or decoded. Decoding errors mean the peer violated
/// the protocol (or the bytes were cut); [`CodecError::BodyTooLarge`] is the caller's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Peer: the input ends `needed` bytes into a field with `remaining` bytes left.
    #[error("truncated: a field needs {needed} bytes, {remaining} remain")]
    Truncated {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the input.
        remaining: usize,
    },
    /// Peer: a header whose first byte is not coro_rpc's magic `0x15`.
    #[error("bad magic byte {0:#04x} (coro_rpc uses 0x15)")]
    BadMagic(u8),
    /// Peer: a header with a coro_rpc protocol version above 0.
    #[error("unsupported coro_rpc version {0}")]
    UnsupportedVersion(u8),
    /// Peer: a request whose serialization type is not struct_pack (0).
    #[error("unsupported serialize_type {0} (only struct_pack, 0)")]
    UnsupportedSerializeType(u8),
    /// Peer: the body is not of the expected type (hash bits 1-31 differ).
    #[error("type hash {got:#010x}, expected {expected:#010x}")]
    TypeHashMismatch {
        /// The expected hash, bit 0 cleared.
        expected: u32,
        /// The received hash, bit 0 cleared.
        got: u32,
    },
    /// Peer: a metainfo byte with bits this subset does not know (a `compatible`
    /// field's total length in bits 0-1, or the reserved bits 5-7).
    #[error("unsupported struct_pack metainfo {0:#04x}")]
    UnsupportedMetainfo(u8),
    /// Peer: the metainfo announces a type literal but no NUL ends it.
    #[error("type literal without NUL terminator")]
    UnterminatedTypeLiteral,
    /// Peer: the type literal differs from the expected type's.
    #[error("type literal {got:02x?}, expected {expected:02x?}")]
    TypeLiteralMismatch {
        /// The expected literal.
        expected: &'static [u8],
        /// The received literal.
        got: Vec<u8>,
    },
    /// Peer: a length prefix that cannot describe data in memory.
    #[error("length {length} does not fit in memory")]
    LengthOverflow {
        /// The length as received.
        length: u64,
    },
    /// Peer: bytes left after the value ended.
    #[error("{count} bytes after the end of the value")]
    TrailingBytes {
        /// Bytes left over.
        count: usize,
    },
    /// Peer: a replica descriptor of a kind this decoder does not read (a local-disk or
    /// distributed-file-system replica: variant index 3 or 4 from 0.3.13, 2 on 0.3.10;
    /// or a later kind), so nothing behind it can be placed. Caller, when encoding: a
    /// kind the chosen layout has no index for (NoF on 0.3.10).
    #[error("replica descriptor of kind {0} (only memory, NVMe-oF and disk replicas are decoded)")]
    UnsupportedReplicaKind(u8),
    /// Caller: a request body longer than the header's u32 length field can say.
    #[error("request body of {bytes} bytes exceeds coro_rpc's 4 GiB limit")]
    BodyTooLarge {
        /// Body size, in bytes.
        bytes: usize,
    },
}

#[cfg(test)]
mod tests;
