//! `GetReplicaList`, the one call whose reply carries the master's read lease
//! (`spec/mooncake-master-rpc.md`, "Where the lease can be read"): encoders and
//! decoders for both sides.
//!
//! The reply is `expected<GetReplicaListResponse, ErrorCode>` with
//! `GetReplicaListResponse { replicas, lease_ttl_ms, object_checksum }` (0.3.13). The
//! lease sits behind the replica descriptors, so the descriptors are decoded in full:
//! memory, NVMe-oF and disk replicas. A local-disk or distributed-file-system replica
//! (kinds 3 and 4) is refused with [`CodecError::UnsupportedReplicaKind`] rather than
//! skipped by a guess at its layout.

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

/// Decodes a successful (`err_code` 0) `GetReplicaList` reply body.
///
/// # Errors
/// A [`CodecError`] for a body that is not 0.3.13's
/// `expected<GetReplicaListResponse, ErrorCode>` (type hash or literal differ), is
/// truncated or has trailing bytes, or holds a replica of kind 3 or 4
/// ([`CodecError::UnsupportedReplicaKind`]).
pub fn decode_get_replica_list_reply(body: &[u8]) -> Result<ReplicaListResult, CodecError> {
    let mut r = PackReader::open(body, Some(types::GET_REPLICA_LIST_REPLY))?;
    if !r.bool()? {
        let code = StoreErrorCode(r.i32()?);
        r.finish()?;
        return Ok(Err(code));
    }
    let count = r.count(MIN_REPLICA_BYTES)?;
    let mut replicas = Vec::with_capacity(count);
    for _ in 0..count {
        let id = r.u64()?;
        let location = match r.u8()? {
            0 => ReplicaLocation::Memory(read_buffer(&mut r)?),
            1 => ReplicaLocation::NoF(read_buffer(&mut r)?),
            2 => ReplicaLocation::Disk {
                file_path: r.string_lossy()?,
                object_size: r.u64()?,
            },
            kind => return Err(CodecError::UnsupportedReplicaKind(kind)),
        };
        let status = r.i32()?;
        replicas.push(ReplicaDescriptor {
            id,
            location,
            status,
        });
    }
    let lease_ttl_ms = r.u64()?;
    let object_checksum = if r.bool()? { Some(r.u64()?) } else { None };
    r.finish()?;
    Ok(Ok(ReplicaList {
        replicas,
        lease_ttl_ms,
        object_checksum,
    }))
}

fn read_buffer(r: &mut PackReader<'_>) -> Result<BufferDescriptor, CodecError> {
    Ok(BufferDescriptor {
        size: r.u64()?,
        buffer_address: r.u64()?,
        protocol: r.string_lossy()?,
        transport_endpoint: r.string_lossy()?,
    })
}

/// Appends a successful `GetReplicaList` reply frame (fake masters in tests).
pub fn encode_get_replica_list_reply(
    out: &mut Vec<u8>,
    seq_num: u32,
    result: &ReplicaListResult,
    literal: TypeLiteral,
) {
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
        let mut w = PackWriter::begin(out, types::GET_REPLICA_LIST_REPLY, literal, max_len);
        match result {
            Err(code) => {
                w.bool(false);
                w.i32(code.0);
            }
            Ok(list) => {
                w.bool(true);
                w.len(list.replicas.len());
                for replica in &list.replicas {
                    w.u64(replica.id);
                    match &replica.location {
                        ReplicaLocation::Memory(b) => {
                            w.u8(0);
                            write_buffer(&mut w, b);
                        }
                        ReplicaLocation::NoF(b) => {
                            w.u8(1);
                            write_buffer(&mut w, b);
                        }
                        ReplicaLocation::Disk {
                            file_path,
                            object_size,
                        } => {
                            w.u8(2);
                            w.str(file_path);
                            w.u64(*object_size);
                        }
                    }
                    w.i32(replica.status);
                }
                w.u64(list.lease_ttl_ms);
                match list.object_checksum {
                    Some(checksum) => {
                        w.bool(true);
                        w.u64(checksum);
                    }
                    None => w.bool(false),
                }
            }
        }
    });
}

fn write_buffer(w: &mut PackWriter<'_>, b: &BufferDescriptor) {
    w.u64(b.size);
    w.u64(b.buffer_address);
    w.str(&b.protocol);
    w.str(&b.transport_endpoint);
}
