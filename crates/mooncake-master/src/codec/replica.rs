//! `GetReplicaList`, the one call whose reply carries the master's read lease
//! (`spec/mooncake-master-rpc.md`, "Where the lease can be read"): encoders and
//! decoders for both sides.
//!
//! The reply is `expected<GetReplicaListResponse, ErrorCode>`, in one of the layouts
//! of [`ReplicaListLayout`], which the reply's type hash names:
//! `{ replicas, lease_ttl_ms, object_checksum }` from 0.3.13 (0.3.14 appends
//! `compatible` fields, skipped), `{ replicas, lease_ttl_ms }` with a three-kind
//! descriptor variant on 0.3.10. The lease sits behind the replica descriptors, so the
//! descriptors are decoded in full: memory, NVMe-oF and disk replicas. A local-disk or
//! distributed-file-system replica is refused with
//! [`CodecError::UnsupportedReplicaKind`] rather than skipped by a guess at its layout.

use super::pack::{PackReader, PackWriter, TypeLiteral};
use super::{CodecError, FunctionId, types};
use crate::StoreErrorCode;
use crate::codec::message::{encode_key_call, reply_frame};

/// Where and how one replica's bytes are held (`Replica::Descriptor::descriptor_variant`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaLocation {
    /// In a segment's memory (variant index 0).
    Memory(BufferDescriptor),
    /// On an NVMe-over-Fabrics device (variant index 1).
    NoF(BufferDescriptor),
    /// In a file (variant index 2).
    Disk {
        /// The file's path.
        file_path: String,
        /// The object's size, in bytes.
        object_size: u64,
    },
}

/// An allocated buffer (`AllocatedBuffer::Descriptor`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferDescriptor {
    /// Bytes.
    pub size: u64,
    /// The buffer's address in the owning segment.
    pub buffer_address: u64,
    /// Transfer protocol, e.g. `"tcp"`.
    pub protocol: String,
    /// The segment's transfer endpoint, `host:port`.
    pub transport_endpoint: String,
}

/// One replica (`Replica::Descriptor`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaDescriptor {
    /// The replica's id.
    pub id: u64,
    /// Where it is held.
    pub location: ReplicaLocation,
    /// `ReplicaStatus` as sent (3 = complete on 0.3.13).
    pub status: i32,
}

/// A successful `GetReplicaList` answer for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaList {
    /// The key's replicas.
    pub replicas: Vec<ReplicaDescriptor>,
    /// The master's `default_kv_lease_ttl`, in milliseconds: the read lease this very
    /// call granted the object (as every positive existence answer does).
    pub lease_ttl_ms: u64,
    /// The object's checksum, when the writer supplied one.
    pub object_checksum: Option<u64>,
}

/// The `GetReplicaList` reply layouts known (`spec/mooncake-master-rpc.md`, "Where the
/// lease can be read"); every master reports version `2.0.0` in `ServiceReady`, so the
/// reply's type hash tells them apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReplicaListLayout {
    /// 0.3.10: no checksum; descriptor variant `<memory 0, disk 1, local disk 2>`.
    V0_3_10,
    /// 0.3.13 and 0.3.14: a trailing `optional<uint64>` checksum; variant
    /// `<memory 0, NoF 1, disk 2, local disk 3, DFS 4>`.
    #[default]
    V0_3_13,
}

impl ReplicaListLayout {
    /// The variant index of a memory (0), NoF (1) or disk (2) replica in this layout's
    /// order of kinds, from the index on the wire; `None` for a kind not decoded.
    fn kind_of(self, index: u8) -> Option<u8> {
        match (self, index) {
            (_, 0) => Some(0),
            (Self::V0_3_10, 1) => Some(2),
            (Self::V0_3_13, 1 | 2) => Some(index),
            _ => None,
        }
    }

    /// The index on the wire of a replica kind (0 memory, 1 NoF, 2 disk).
    fn index_of(self, kind: u8) -> Option<u8> {
        match (self, kind) {
            (_, 0) => Some(0),
            (Self::V0_3_10, 2) => Some(1),
            (Self::V0_3_10, _) => None,
            (Self::V0_3_13, k) => Some(k),
        }
    }

    fn pack_type(self) -> super::pack::PackType {
        match self {
            Self::V0_3_10 => types::GET_REPLICA_LIST_REPLY_0_3_10,
            Self::V0_3_13 => types::GET_REPLICA_LIST_REPLY,
        }
    }
}

/// One `GetReplicaList` answer: the list, or the master's `ErrorCode` (`-704` object
/// not found, `-706`... as [`StoreErrorCode`] names them).
pub type ReplicaListResult = Result<ReplicaList, StoreErrorCode>;

/// Smallest encoded replica: id (8), variant index (1), disk path length (1), object
/// size (8), status (4).
const MIN_REPLICA_BYTES: usize = 22;

/// Appends a `GetReplicaList(key, tenant_id)` request frame (≥ 0.3.12; the bare `key`
/// when `tenant_id` is `None`). The arguments are those of `ExistKey`.
///
/// # Errors
/// [`CodecError::BodyTooLarge`] when the body would exceed 4 GiB (nothing appended).
pub fn encode_get_replica_list(
    out: &mut Vec<u8>,
    seq_num: u32,
    key: &str,
    tenant_id: Option<&str>,
    literal: TypeLiteral,
) -> Result<(), CodecError> {
    encode_key_call(
        out,
        seq_num,
        FunctionId::GET_REPLICA_LIST,
        key,
        tenant_id,
        literal,
    )
}

/// Decodes a successful (`err_code` 0) `GetReplicaList` reply body, in whichever
/// [`ReplicaListLayout`] its type hash names.
///
/// # Errors
/// A [`CodecError`] for a body of another type (the hash matches no known layout, or
/// the literal differs), truncated or with trailing bytes (`compatible` fields a later
/// version appends are skipped), or holding a replica of a kind not decoded
/// ([`CodecError::UnsupportedReplicaKind`] with the index as sent).
pub fn decode_get_replica_list_reply(body: &[u8]) -> Result<ReplicaListResult, CodecError> {
    decode_get_replica_list_reply_layout(body).map(|(result, _)| result)
}

/// As [`decode_get_replica_list_reply`], also naming the layout the reply came in.
///
/// # Errors
/// As [`decode_get_replica_list_reply`].
pub fn decode_get_replica_list_reply_layout(
    body: &[u8],
) -> Result<(ReplicaListResult, ReplicaListLayout), CodecError> {
    const LAYOUTS: [ReplicaListLayout; 2] =
        [ReplicaListLayout::V0_3_13, ReplicaListLayout::V0_3_10];
    let (mut r, index) = PackReader::open_any(body, &LAYOUTS.map(ReplicaListLayout::pack_type))?;
    let layout = LAYOUTS[index];
    if !r.bool()? {
        let code = StoreErrorCode(r.i32()?);
        r.finish()?;
        return Ok((Err(code), layout));
    }
    let count = r.count(MIN_REPLICA_BYTES)?;
    let mut replicas = Vec::with_capacity(count);
    for _ in 0..count {
        let id = r.u64()?;
        let index = r.u8()?;
        let location = match layout.kind_of(index) {
            Some(0) => ReplicaLocation::Memory(read_buffer(&mut r)?),
            Some(1) => ReplicaLocation::NoF(read_buffer(&mut r)?),
            Some(_) => ReplicaLocation::Disk {
                file_path: r.string_lossy()?,
                object_size: r.u64()?,
            },
            None => return Err(CodecError::UnsupportedReplicaKind(index)),
        };
        let status = r.i32()?;
        replicas.push(ReplicaDescriptor {
            id,
            location,
            status,
        });
    }
    let lease_ttl_ms = r.u64()?;
    let object_checksum = match layout {
        ReplicaListLayout::V0_3_10 => None,
        ReplicaListLayout::V0_3_13 if r.bool()? => Some(r.u64()?),
        ReplicaListLayout::V0_3_13 => None,
    };
    r.finish()?;
    let list = ReplicaList {
        replicas,
        lease_ttl_ms,
        object_checksum,
    };
    Ok((Ok(list), layout))
}

fn read_buffer(r: &mut PackReader<'_>) -> Result<BufferDescriptor, CodecError> {
    Ok(BufferDescriptor {
        size: r.u64()?,
        buffer_address: r.u64()?,
        protocol: r.string_lossy()?,
        transport_endpoint: r.string_lossy()?,
    })
}

/// Appends a successful `GetReplicaList` reply frame in 0.3.13's layout (fake masters
/// in tests).
pub fn encode_get_replica_list_reply(
    out: &mut Vec<u8>,
    seq_num: u32,
    result: &ReplicaListResult,
    literal: TypeLiteral,
) {
    // Every location has an index in 0.3.13's layout.
    let _ =
        encode_get_replica_list_reply_in(out, seq_num, result, literal, ReplicaListLayout::V0_3_13);
}

/// Appends a successful `GetReplicaList` reply frame in `layout` (fake masters in
/// tests). 0.3.10's layout has no checksum field: a checksum is not sent.
///
/// # Errors
/// [`CodecError::UnsupportedReplicaKind`] (nothing appended) for a replica whose kind
/// the layout has no index for: NoF (1) on 0.3.10.
pub fn encode_get_replica_list_reply_in(
    out: &mut Vec<u8>,
    seq_num: u32,
    result: &ReplicaListResult,
    literal: TypeLiteral,
    layout: ReplicaListLayout,
) -> Result<(), CodecError> {
    let kind = |location: &ReplicaLocation| match location {
        ReplicaLocation::Memory(_) => 0,
        ReplicaLocation::NoF(_) => 1,
        ReplicaLocation::Disk { .. } => 2,
    };
    let mut indices = Vec::new();
    if let Ok(list) = result {
        for replica in &list.replicas {
            let kind = kind(&replica.location);
            indices.push(
                layout
                    .index_of(kind)
                    .ok_or(CodecError::UnsupportedReplicaKind(kind))?,
            );
        }
    }
    let max_len = match result {
        Ok(list) => list
            .replicas
            .iter()
            .map(|replica| match &replica.location {
                ReplicaLocation::Memory(b) | ReplicaLocation::NoF(b) => {
                    b.protocol.len().max(b.transport_endpoint.len())
                }
                ReplicaLocation::Disk { file_path, .. } => file_path.len(),
            })
            .fold(list.replicas.len(), usize::max),
        Err(_) => 0,
    };
    reply_frame(out, seq_num, 0, |out| {
        let mut w = PackWriter::begin(out, layout.pack_type(), literal, max_len);
        match result {
            Err(code) => {
                w.bool(false);
                w.i32(code.0);
            }
            Ok(list) => {
                w.bool(true);
                w.len(list.replicas.len());
                for (replica, &index) in list.replicas.iter().zip(&indices) {
                    w.u64(replica.id);
                    w.u8(index);
                    match &replica.location {
                        ReplicaLocation::Memory(b) | ReplicaLocation::NoF(b) => {
                            write_buffer(&mut w, b);
                        }
                        ReplicaLocation::Disk {
                            file_path,
                            object_size,
                        } => {
                            w.str(file_path);
                            w.u64(*object_size);
                        }
                    }
                    w.i32(replica.status);
                }
                w.u64(list.lease_ttl_ms);
                if layout == ReplicaListLayout::V0_3_13 {
                    match list.object_checksum {
                        Some(checksum) => {
                            w.bool(true);
                            w.u64(checksum);
                        }
                        None => w.bool(false),
                    }
                }
            }
        }
    });
    Ok(())
}

fn write_buffer(w: &mut PackWriter<'_>, b: &BufferDescriptor) {
    w.u64(b.size);
    w.u64(b.buffer_address);
    w.str(&b.protocol);
    w.str(&b.transport_endpoint);
}
