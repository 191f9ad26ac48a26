//! coro_rpc frame headers (`spec/mooncake-master-rpc.md`, "Transport").

use super::{CodecError, FunctionId};

/// First byte of every coro_rpc header, request and reply.
pub const MAGIC: u8 = 0x15;
/// The only coro_rpc protocol version (`version` byte); a higher one is refused.
pub const VERSION: u8 = 0;
/// `serialize_type` of struct_pack, the only one coro_rpc defines.
pub const SERIALIZE_STRUCT_PACK: u8 = 0;
/// Length of a request header, in bytes.
pub const REQUEST_HEADER_LEN: usize = 20;
/// Length of a reply header, in bytes.
pub const REPLY_HEADER_LEN: usize = 16;

/// The 20-byte header in front of every request body: `magic, version,
/// serialize_type, msg_type` (one byte each), then `seq_num, function_id,
/// body_length, attach_length` (u32 little-endian each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// The client's tag for this request, echoed in the reply; any value.
    pub seq_num: u32,
    /// Which function of the master to call.
    pub function_id: FunctionId,
    /// Length of the struct_pack body that follows, in bytes.
    pub body_length: u32,
    /// Length of the raw attachment after the body, in bytes; 0 for every call here.
    pub attach_length: u32,
}

impl RequestHeader {
    /// The header's 20 bytes.
    #[must_use]
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut out = [0; REQUEST_HEADER_LEN];
        out[0] = MAGIC;
        out[1] = VERSION;
        out[2] = SERIALIZE_STRUCT_PACK;
        out[3] = 0;
        out[4..8].copy_from_slice(&self.seq_num.to_le_bytes());
        out[8..12].copy_from_slice(&self.function_id.0.to_le_bytes());
        out[12..16].copy_from_slice(&self.body_length.to_le_bytes());
        out[16..20].copy_from_slice(&self.attach_length.to_le_bytes());
        out
    }

    /// Reads a request header from the first 20 bytes of `bytes` (what a master, or a
    /// fake one in tests, receives).
    ///
    /// # Errors
    /// [`CodecError::Truncated`] with fewer than 20 bytes, [`CodecError::BadMagic`],
    /// [`CodecError::UnsupportedVersion`], [`CodecError::UnsupportedSerializeType`].
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let h = fixed::<REQUEST_HEADER_LEN>(bytes)?;
        check_magic_version(h[0], h[1])?;
        if h[2] != SERIALIZE_STRUCT_PACK {
            return Err(CodecError::UnsupportedSerializeType(h[2]));
        }
        Ok(Self {
            seq_num: u32_at(&h, 4),
            function_id: FunctionId(u32_at(&h, 8)),
            body_length: u32_at(&h, 12),
            attach_length: u32_at(&h, 16),
        })
    }
}

/// The 16-byte header in front of every reply body: `magic, version, err_code,
/// msg_type` (one byte each), then `seq_num, body_length, attach_length` (u32
/// little-endian each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyHeader {
    /// 0: the body is the function's return value. Otherwise an RPC-level failure
    /// whose body is a message (see [`decode_error_reply`](super::decode_error_reply)):
    /// 4 invalid arguments, 11 function not registered, 255 a 16-bit code in the body.
    pub err_code: u8,
    /// Message type; 0 in every reply seen.
    pub msg_type: u8,
    /// The request's `seq_num`, echoed.
    pub seq_num: u32,
    /// Length of the body that follows, in bytes.
    pub body_length: u32,
    /// Length of the raw attachment after the body, in bytes.
    pub attach_length: u32,
}

impl ReplyHeader {
    /// The header's 16 bytes.
    #[must_use]
    pub fn encode(&self) -> [u8; REPLY_HEADER_LEN] {
        let mut out = [0; REPLY_HEADER_LEN];
        out[0] = MAGIC;
        out[1] = VERSION;
        out[2] = self.err_code;
        out[3] = self.msg_type;
        out[4..8].copy_from_slice(&self.seq_num.to_le_bytes());
        out[8..12].copy_from_slice(&self.body_length.to_le_bytes());
        out[12..16].copy_from_slice(&self.attach_length.to_le_bytes());
        out
    }

    /// Reads a reply header from the first 16 bytes of `bytes`.
    ///
    /// # Errors
    /// [`CodecError::Truncated`] with fewer than 16 bytes, [`CodecError::BadMagic`],
    /// [`CodecError::UnsupportedVersion`].
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let h = fixed::<REPLY_HEADER_LEN>(bytes)?;
        check_magic_version(h[0], h[1])?;
        Ok(Self {
            err_code: h[2],
            msg_type: h[3],
            seq_num: u32_at(&h, 4),
            body_length: u32_at(&h, 8),
            attach_length: u32_at(&h, 12),
        })
    }

    /// Bytes that follow this header on the wire (body and attachment), as `u64` so
    /// that the sum of two u32 lengths cannot overflow.
    #[must_use]
    pub fn payload_len(&self) -> u64 {
        u64::from(self.body_length) + u64::from(self.attach_length)
    }
}

fn fixed<const N: usize>(bytes: &[u8]) -> Result<[u8; N], CodecError> {
    bytes
        .get(..N)
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .ok_or(CodecError::Truncated {
            needed: N,
            remaining: bytes.len(),
        })
}

fn check_magic_version(magic: u8, version: u8) -> Result<(), CodecError> {
    if magic != MAGIC {
        return Err(CodecError::BadMagic(magic));
    }
    if version > VERSION {
        return Err(CodecError::UnsupportedVersion(version));
    }
    Ok(())
}

fn u32_at(h: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}
