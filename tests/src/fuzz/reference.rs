//! Reference decoders written from `spec/wire.md` alone (not from `lookup_core::wire`),
//! so the fuzz tests assert exact results, not just "no panic".

use bytes::Bytes;
use lookup_core::BlockHashes;
use lookup_core::wire::{
    Format, LookupReply, MAX_HASH_LEN, MAX_HASHES, ServerRequest, TailKeyBoundary, WireError,
};

/// What `decode_lookup_reply` must answer (`spec/wire.md`, lookup reply): one frame;
/// the 1-byte error reply `0x00` in either format; otherwise `tagged-blob` 4 + 8k
/// bytes, `msgpack-hex` exactly 4.
pub fn reference_lookup_reply(format: Format, frames: &[Bytes]) -> Result<LookupReply, WireError> {
    let [frame] = frames else {
        return Err(WireError::WrongFrameCount {
            expected: 1,
            got: frames.len(),
        });
    };
    let n = frame.len();
    if frame.as_ref() == [0x00] {
        // `spec/wire.md`, "Store unavailable": the server's error reply.
        return Err(WireError::StoreUnavailable);
    }
    let ok = match format {
        Format::TaggedBlob => n >= 4 && (n - 4) % 8 == 0,
        Format::MsgpackHex => n == 4,
    };
    if !ok {
        return Err(WireError::ReplyLength(n));
    }
    let be =
        |at: usize| u32::from_be_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]]);
    Ok(LookupReply {
        hit_tokens: be(0),
        boundaries: (4..n)
            .step_by(8)
            .map(|at| TailKeyBoundary {
                group_id: be(at),
                boundary_tokens: be(at + 4),
            })
            .collect(),
    })
}

/// What `decode_reset_reply` must answer: one frame of `0x01` (true) or `0x00`
/// (false); anything else is an error keeping at most 16 bytes.
pub fn reference_reset_reply(frames: &[Bytes]) -> Result<bool, WireError> {
    let [frame] = frames else {
        return Err(WireError::WrongFrameCount {
            expected: 1,
            got: frames.len(),
        });
    };
    match frame.as_ref() {
        [1] => Ok(true),
        [0] => Ok(false),
        other => Err(WireError::ResetReply(other[..other.len().min(16)].to_vec())),
    }
}

/// What `decode_request` must answer for a `tagged-blob` lookup (frame 0 `lookup`),
/// with the checks in the order its documentation gives.
pub fn reference_tagged(frames: &[Bytes]) -> ServerRequest {
    let malformed = |error| ServerRequest::Malformed {
        format: Format::TaggedBlob,
        error,
    };
    let [_, tokens, len, hashes] = frames else {
        return malformed(WireError::WrongFrameCount {
            expected: 4,
            got: frames.len(),
        });
    };
    if tokens.len() != 4 {
        return malformed(WireError::BadLength {
            what: "num_tokens",
            expected: 4,
            got: tokens.len(),
        });
    }
    if len.len() != 2 {
        return malformed(WireError::BadLength {
            what: "hash_len",
            expected: 2,
            got: len.len(),
        });
    }
    let hash_len = u16::from_be_bytes([len[0], len[1]]);
    if usize::from(hash_len) > MAX_HASH_LEN {
        return malformed(WireError::HashTooLong {
            len: usize::from(hash_len),
            max: MAX_HASH_LEN,
        });
    }
    let bytes = hashes.len();
    if (hash_len == 0 && bytes > 0) || (hash_len > 0 && bytes % usize::from(hash_len) != 0) {
        return malformed(WireError::HashBytes { hash_len, bytes });
    }
    let count = if hash_len == 0 {
        0
    } else {
        bytes / usize::from(hash_len)
    };
    if count > MAX_HASHES {
        return malformed(WireError::TooManyHashes {
            count,
            max: MAX_HASHES,
        });
    }
    ServerRequest::Lookup {
        format: Format::TaggedBlob,
        num_tokens: u32::from_be_bytes([tokens[0], tokens[1], tokens[2], tokens[3]]),
        block_hashes: BlockHashes::new(hash_len, hashes.clone()).expect("checked above"),
    }
}

/// A MessagePack length header at the front of `rest`: `(length, header bytes)`.
fn header(rest: &[u8], array: bool) -> Option<(u64, usize)> {
    let be = |n: usize| -> Option<u64> {
        let field = rest.get(1..1 + n)?;
        Some(field.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    };
    let marker = *rest.first()?;
    match (array, marker) {
        (true, 0x90..=0x9f) => Some((u64::from(marker & 0x0f), 1)),
        (true, 0xdc) => Some((be(2)?, 3)),
        (true, 0xdd) => Some((be(4)?, 5)),
        (false, 0xa0..=0xbf) => Some((u64::from(marker & 0x1f), 1)),
        (false, 0xd9) => Some((be(1)?, 2)),
        (false, 0xda) => Some((be(2)?, 3)),
        (false, 0xdb) => Some((be(4)?, 5)),
        _ => None,
    }
}

/// The hashes of a `msgpack-hex` array frame (`spec/wire.md`, `msgpack-hex`): one
/// array, at most [`MAX_HASHES`] strings, each non-empty hex of even length, either
/// case, at most `2 * MAX_HASH_LEN` digits, all of the first one's length, nothing
/// after the array. `None` when the frame breaks any of that.
pub fn reference_msgpack_hashes(frame: &[u8]) -> Option<BlockHashes> {
    let (count, used) = header(frame, true)?;
    if count > MAX_HASHES as u64 {
        return None;
    }
    let mut rest = &frame[used..];
    let mut hashes: Vec<Vec<u8>> = Vec::new();
    for _ in 0..count {
        let (len, used) = header(rest, false)?;
        let len = usize::try_from(len).ok()?;
        let digits = rest.get(used..used.checked_add(len)?)?;
        rest = &rest[used + len..];
        if len == 0 || len % 2 != 0 || len / 2 > MAX_HASH_LEN {
            return None;
        }
        if hashes.first().is_some_and(|h| h.len() * 2 != len) {
            return None;
        }
        let text = std::str::from_utf8(digits).ok()?;
        let hash = (0..len)
            .step_by(2)
            .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        // from_str_radix accepts a leading '+'; hex digits only.
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        hashes.push(hash);
    }
    if !rest.is_empty() {
        return None;
    }
    Some(BlockHashes::from_hashes(&hashes).expect("equal lengths"))
}

/// How `decode_request` must classify any request (its documentation, steps 1-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A `tagged-blob` lookup (frame 0 is `lookup`).
    Tagged,
    /// A `tagged-blob` reset (the single frame `reset`).
    Reset,
    /// A `msgpack-hex` lookup (two frames, the first 4 bytes).
    Msgpack,
    /// Neither format.
    Unknown,
}

/// The kind of `frames` by the rules of `spec/wire.md` alone.
pub fn reference_kind(frames: &[Bytes]) -> Kind {
    match frames {
        [tag, ..] if tag.as_ref() == b"lookup" => Kind::Tagged,
        [only] if only.as_ref() == b"reset" => Kind::Reset,
        [tokens, _] if tokens.len() == 4 => Kind::Msgpack,
        _ => Kind::Unknown,
    }
}

/// The kind `decode_request` gave `request` (a malformed lookup keeps its format).
pub fn kind_of(request: &ServerRequest) -> Kind {
    match request {
        ServerRequest::Lookup {
            format: Format::TaggedBlob,
            ..
        }
        | ServerRequest::Malformed {
            format: Format::TaggedBlob,
            ..
        } => Kind::Tagged,
        ServerRequest::Lookup {
            format: Format::MsgpackHex,
            ..
        }
        | ServerRequest::Malformed {
            format: Format::MsgpackHex,
            ..
        } => Kind::Msgpack,
        ServerRequest::Reset => Kind::Reset,
        _ => Kind::Unknown,
    }
}

/// Total bytes of a message.
pub fn size(frames: &[Bytes]) -> usize {
    frames.iter().map(Bytes::len).sum()
}
