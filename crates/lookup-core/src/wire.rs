//! The lookup wire codec: both vLLM formats of `spec/wire.md`, client and server side.
//!
//! Pure functions from frames to values and back; no sockets, no state. A frame is one
//! ZeroMQ message part, given as [`Bytes`] so that block hashes received by a server
//! are sliced out of the frame, never copied (`tagged-blob`).
//!
//! | side | encode | decode |
//! |---|---|---|
//! | client | [`encode_lookup`], [`encode_reset`] | [`decode_lookup_reply`], [`decode_reset_reply`] |
//! | server | [`encode_lookup_reply`], [`encode_store_unavailable`], [`encode_reset_reply`], [`unknown_tag_reply`] | [`decode_request`] |
//!
//! Decoders never panic and never trust a length field: every claimed count or length is
//! checked against [`MAX_HASHES`], [`MAX_HASH_LEN`] and the bytes actually present before
//! anything is allocated from it.
//!
//! ```
//! use lookup_core::BlockHashes;
//! use lookup_core::wire::{self, Format, LookupReply, ServerRequest};
//!
//! let hashes = BlockHashes::from_hashes(&[[0x11; 32], [0x22; 32]]).unwrap();
//! let frames = wire::encode_lookup(Format::TaggedBlob, 40, 16, &hashes);
//! assert_eq!(
//!     wire::decode_request(&frames),
//!     ServerRequest::Lookup { format: Format::TaggedBlob, num_tokens: 40, block_hashes: hashes },
//! );
//!
//! let reply = LookupReply { hit_tokens: 32, boundaries: vec![] };
//! let frame = wire::encode_lookup_reply(Format::TaggedBlob, &reply);
//! assert_eq!(frame.as_ref(), &[0, 0, 0, 32]);
//! assert_eq!(wire::decode_lookup_reply(Format::TaggedBlob, &[frame]), Ok(reply));
//! ```

use std::fmt;
use std::str::FromStr;

use bytes::{BufMut, Bytes, BytesMut};

pub use crate::error::WireError;
use crate::{BlockHashes, Error};

/// Tag frame of a `tagged-blob` lookup request (`spec/wire.md`, `tagged-blob`, frame 0).
const LOOKUP_TAG: &[u8] = b"lookup";
/// The single frame of a `tagged-blob` reset request (`spec/wire.md`, `tagged-blob`).
const RESET_TAG: &[u8] = b"reset";
/// Reset reply byte: the store was wiped.
const RESET_OK: u8 = 0x01;
/// Reset reply byte: the wipe failed; also the whole reply to an unknown tag.
const RESET_FAILED: u8 = 0x00;
/// The whole reply, in either format, to a lookup the server could not ask its store
/// about: vLLM's `RESP_ERR` (`spec/wire.md`, "Store unavailable").
const STORE_UNAVAILABLE: u8 = 0x00;
/// Bytes of one tail-key boundary entry in a `tagged-blob` reply: two u32.
const BOUNDARY_BYTES: usize = 8;
/// Bytes of the `hit_tokens` field that starts every lookup reply.
const HIT_BYTES: usize = 4;
/// Longest reset reply kept in [`WireError::ResetReply`] (bytes).
const RESET_REPLY_KEPT: usize = 16;

/// Most block hashes accepted in one lookup request.
///
/// At vLLM's default block size of 16 tokens this is a prompt of 1 Mi tokens; at the
/// Mooncake traces' 512, 32 Mi tokens. A decoder checks a claimed count against this
/// limit before allocating anything for it (ours, not in vLLM).
pub const MAX_HASHES: usize = 65_536;

/// Longest block hash accepted in a lookup request, in bytes (the hash, not its hex).
///
/// vLLM's hashes are 32 bytes (sha256) or 8 (integer ids); 256 leaves room for any
/// digest. Checked before allocating (ours, not in vLLM).
pub const MAX_HASH_LEN: usize = 256;

/// One of the two wire formats of `spec/wire.md`.
///
/// Parsed from and displayed as its name in the spec: `"tagged-blob"`, `"msgpack-hex"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Format {
    /// vLLM 0.33's format (the default): tagged multi-frame requests, binary hashes,
    /// replies with tail-key boundaries, and a reset message (`spec/wire.md`,
    /// `tagged-blob`; vLLM #45659).
    #[default]
    TaggedBlob,
    /// The format before vLLM #45659: a floored token count and a MessagePack array of
    /// hex strings; 4-byte replies; no reset (`spec/wire.md`, `msgpack-hex`).
    MsgpackHex,
}

impl Format {
    /// The format's name in `spec/wire.md` and in configuration.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TaggedBlob => "tagged-blob",
            Self::MsgpackHex => "msgpack-hex",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Format {
    type Err = Error;

    /// Parses `"tagged-blob"` or `"msgpack-hex"` (exact, lowercase).
    ///
    /// # Errors
    /// [`Error::UnknownFormat`] for any other name.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tagged-blob" => Ok(Self::TaggedBlob),
            "msgpack-hex" => Ok(Self::MsgpackHex),
            other => Err(Error::UnknownFormat(other.to_owned())),
        }
    }
}

/// One tail-key boundary of a `tagged-blob` lookup reply: 8 bytes on the wire,
/// `group_id` then `boundary_tokens`, both u32 big-endian (`spec/wire.md`,
/// `tagged-blob`, lookup reply). Hybrid-attention models send them; plain models none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TailKeyBoundary {
    /// KV-cache group the boundary belongs to.
    pub group_id: u32,
    /// Token position of the boundary (tokens).
    pub boundary_tokens: u32,
}

/// A decoded lookup reply (`spec/wire.md`, lookup reply of either format).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LookupReply {
    /// Leading prompt tokens found in the store (tokens).
    pub hit_tokens: u32,
    /// Tail-key boundaries, in wire order. Always empty in `msgpack-hex`, which has no
    /// room for them.
    pub boundaries: Vec<TailKeyBoundary>,
}

// ---------------------------------------------------------------------------------
// Client side
// ---------------------------------------------------------------------------------

/// Encodes a lookup request for `num_tokens` prompt tokens and their block hashes.
///
/// - `tagged-blob`: 4 frames `[b"lookup", num_tokens u32 BE, hash_len u16 BE, hashes
///   concatenated]`; `num_tokens` is sent unaligned, `block_size` is unused, `hash_len`
///   is 0 with an empty frame 3 when there are no hashes (`spec/wire.md`, `tagged-blob`).
/// - `msgpack-hex`: 2 frames `[token_len u32 BE, msgpack array of lowercase-hex str]`,
///   where `token_len = floor(num_tokens / block_size) * block_size` tokens, and the
///   array is `0x90` when empty (`spec/wire.md`, `msgpack-hex`). A `block_size` of 0
///   sends `num_tokens` unfloored rather than dividing by zero.
///
/// # Panics
/// In `msgpack-hex`, if there are more than `u32::MAX` hashes, which a MessagePack
/// array cannot hold (4 Gi blocks is far beyond any prompt). A hash's hex always fits
/// a MessagePack string: [`BlockHashes`] limits a hash to `u16::MAX` bytes.
#[must_use]
pub fn encode_lookup(
    format: Format,
    num_tokens: u32,
    block_size: u32,
    block_hashes: &BlockHashes,
) -> Vec<Bytes> {
    match format {
        Format::TaggedBlob => vec![
            Bytes::from_static(LOOKUP_TAG),
            Bytes::copy_from_slice(&num_tokens.to_be_bytes()),
            Bytes::copy_from_slice(&block_hashes.hash_len().to_be_bytes()),
            block_hashes.as_bytes().clone(),
        ],
        Format::MsgpackHex => {
            let token_len = num_tokens
                .checked_rem(block_size)
                .map_or(num_tokens, |r| num_tokens - r);
            vec![
                Bytes::copy_from_slice(&token_len.to_be_bytes()),
                Bytes::from(encode_hex_array(block_hashes)),
            ]
        }
    }
}

/// The MessagePack array of lowercase-hex strings of `msgpack-hex` frame 1.
fn encode_hex_array(block_hashes: &BlockHashes) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let count = u32::try_from(block_hashes.len()).expect("more than u32::MAX block hashes");
    let hex_len = u32::from(block_hashes.hash_len()) * 2;
    // 5 bytes: the largest array header, and the largest str header.
    let capacity = 5 + block_hashes.len() * (5 + 2 * usize::from(block_hashes.hash_len()));
    // ByteBuf's write error type is `Infallible`, so these patterns are irrefutable.
    let mut out = rmp::encode::ByteBuf::with_capacity(capacity);
    let Ok(_) = rmp::encode::write_array_len(&mut out, count);
    for hash in block_hashes.iter() {
        let Ok(_) = rmp::encode::write_str_len(&mut out, hex_len);
        let digits = out.as_mut_vec();
        for &byte in hash {
            digits.push(HEX[usize::from(byte >> 4)]);
            digits.push(HEX[usize::from(byte & 0x0f)]);
        }
    }
    out.into_vec()
}

/// Encodes a reset request: `tagged-blob` only, the single frame `b"reset"`
/// (`spec/wire.md`, `tagged-blob`, reset request).
///
/// # Errors
/// [`Error::NoReset`] for `msgpack-hex`, which has no reset message.
pub fn encode_reset(format: Format) -> Result<Vec<Bytes>, Error> {
    match format {
        Format::TaggedBlob => Ok(vec![Bytes::from_static(RESET_TAG)]),
        Format::MsgpackHex => Err(Error::NoReset),
    }
}

/// Decodes a lookup reply: exactly one frame.
///
/// - `tagged-blob`: `hit_tokens` u32 BE (4 bytes), then zero or more 8-byte
///   `(group_id u32 BE, boundary_tokens u32 BE)` tail-key boundaries.
/// - `msgpack-hex`: exactly 4 bytes of `hit_tokens` u32 BE; no boundaries.
///
/// Only the shape is checked here; whether `hit_tokens` is plausible (not above the
/// request's tokens, a block multiple) is the caller's guard (`spec/wire.md`,
/// "Client-side guards").
///
/// # Errors
/// [`WireError::WrongFrameCount`] unless there is exactly one frame;
/// [`WireError::StoreUnavailable`] for the error reply of either format, the single
/// byte `0x00` ([`encode_store_unavailable`]: the server could not ask its store);
/// [`WireError::ReplyLength`] for any other `tagged-blob` frame below 4 bytes or not
/// 4 + 8k bytes, or a `msgpack-hex` frame that is not 4 bytes (`spec/wire.md`, lookup
/// reply).
pub fn decode_lookup_reply(format: Format, frames: &[Bytes]) -> Result<LookupReply, WireError> {
    let frame = single_frame(frames)?;
    if frame.as_ref() == [STORE_UNAVAILABLE] {
        return Err(WireError::StoreUnavailable);
    }
    let (hit, rest) = frame
        .split_first_chunk::<HIT_BYTES>()
        .ok_or(WireError::ReplyLength(frame.len()))?;
    let hit_tokens = u32::from_be_bytes(*hit);
    let well_formed = match format {
        Format::TaggedBlob => rest.len() % BOUNDARY_BYTES == 0,
        Format::MsgpackHex => rest.is_empty(),
    };
    if !well_formed {
        return Err(WireError::ReplyLength(frame.len()));
    }
    // Bounded by the frame already in memory: 8 bytes in, 8 bytes out.
    let boundaries = rest
        .chunks_exact(BOUNDARY_BYTES)
        .map(|entry| {
            let (group, tokens) = entry.split_at(4);
            TailKeyBoundary {
                group_id: u32::from_be_bytes([group[0], group[1], group[2], group[3]]),
                boundary_tokens: u32::from_be_bytes([tokens[0], tokens[1], tokens[2], tokens[3]]),
            }
        })
        .collect();
    Ok(LookupReply {
        hit_tokens,
        boundaries,
    })
}

/// Decodes a reset reply: one frame of one byte, `0x01` (the store was wiped: `true`)
/// or `0x00` (the wipe failed: `false`) (`spec/wire.md`, `tagged-blob`, reset).
///
/// # Errors
/// [`WireError::WrongFrameCount`] unless there is exactly one frame;
/// [`WireError::ResetReply`] for any other content.
pub fn decode_reset_reply(frames: &[Bytes]) -> Result<bool, WireError> {
    match single_frame(frames)?.as_ref() {
        [RESET_OK] => Ok(true),
        [RESET_FAILED] => Ok(false),
        other => Err(WireError::ResetReply(
            other[..other.len().min(RESET_REPLY_KEPT)].to_vec(),
        )),
    }
}

/// The only frame of a reply, or [`WireError::WrongFrameCount`].
fn single_frame(frames: &[Bytes]) -> Result<&Bytes, WireError> {
    match frames {
        [frame] => Ok(frame),
        _ => Err(WireError::WrongFrameCount {
            expected: 1,
            got: frames.len(),
        }),
    }
}

// ---------------------------------------------------------------------------------
// Server side
// ---------------------------------------------------------------------------------

/// A request as a lookup server sees it, in either format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerRequest {
    /// A well-formed lookup: answer with [`encode_lookup_reply`] in `format`.
    Lookup {
        /// The format the request came in; the reply must use the same.
        format: Format,
        /// Tokens of the request: `tagged-blob`'s `num_tokens` (unaligned) or
        /// `msgpack-hex`'s `token_len` (already floored by the client).
        num_tokens: u32,
        /// The request's block hashes, in order (shares the frame's memory in
        /// `tagged-blob`).
        block_hashes: BlockHashes,
    },
    /// A reset (`tagged-blob` only): wipe the store, answer [`encode_reset_reply`].
    Reset,
    /// A lookup in `format` that does not parse: the server answers hit 0 in that
    /// format, logs and counts it, and never dies (`spec/wire.md`, "What the server
    /// computes").
    Malformed {
        /// The format the request was recognised as.
        format: Format,
        /// What is wrong with it.
        error: WireError,
    },
    /// Anything else: the server answers [`unknown_tag_reply`], the single byte `0x00`
    /// (`spec/wire.md`, `tagged-blob`, unknown tag).
    Unknown,
}

/// Classifies and decodes one request received by a lookup server.
///
/// Detection, in order (`spec/wire.md`, both formats):
/// 1. frame 0 is `b"lookup"`: a `tagged-blob` lookup. It must have exactly 4 frames,
///    frame 1 of 4 bytes, frame 2 of 2 bytes, `hash_len` at most [`MAX_HASH_LEN`],
///    frame 3 of `hash_len * k` bytes with `k` at most [`MAX_HASHES`] (`hash_len` 0
///    requires an empty frame 3); otherwise [`ServerRequest::Malformed`].
/// 2. exactly one frame, `b"reset"`: [`ServerRequest::Reset`].
/// 3. exactly 2 frames with frame 0 of 4 bytes: a `msgpack-hex` lookup. Frame 1 must be
///    one MessagePack array (at most [`MAX_HASHES`] entries) of strings, each non-empty
///    hex of even length (either case), all of the same length, at most
///    `2 * MAX_HASH_LEN` digits, with nothing after the array; otherwise
///    [`ServerRequest::Malformed`].
/// 4. anything else: [`ServerRequest::Unknown`].
///
/// Never panics. Never allocates from a claimed length before checking it against the
/// limits and the bytes actually present; `tagged-blob` hashes are not copied at all.
#[must_use]
pub fn decode_request(frames: &[Bytes]) -> ServerRequest {
    match frames {
        [tag, ..] if tag.as_ref() == LOOKUP_TAG => match decode_tagged_lookup(frames) {
            Ok((num_tokens, block_hashes)) => ServerRequest::Lookup {
                format: Format::TaggedBlob,
                num_tokens,
                block_hashes,
            },
            Err(error) => ServerRequest::Malformed {
                format: Format::TaggedBlob,
                error,
            },
        },
        [only] if only.as_ref() == RESET_TAG => ServerRequest::Reset,
        [token_len, array] => match <[u8; 4]>::try_from(token_len.as_ref()) {
            Ok(token_len) => match decode_hex_array(array) {
                Ok(block_hashes) => ServerRequest::Lookup {
                    format: Format::MsgpackHex,
                    num_tokens: u32::from_be_bytes(token_len),
                    block_hashes,
                },
                Err(error) => ServerRequest::Malformed {
                    format: Format::MsgpackHex,
                    error,
                },
            },
            Err(_) => ServerRequest::Unknown,
        },
        _ => ServerRequest::Unknown,
    }
}

/// `(num_tokens, hashes)` of a `tagged-blob` lookup whose frame 0 is `b"lookup"`.
fn decode_tagged_lookup(frames: &[Bytes]) -> Result<(u32, BlockHashes), WireError> {
    let [_, num_tokens, hash_len, hashes] = frames else {
        return Err(WireError::WrongFrameCount {
            expected: 4,
            got: frames.len(),
        });
    };
    let num_tokens =
        <[u8; 4]>::try_from(num_tokens.as_ref()).map_err(|_| WireError::BadLength {
            what: "num_tokens",
            expected: 4,
            got: num_tokens.len(),
        })?;
    let hash_len = <[u8; 2]>::try_from(hash_len.as_ref()).map_err(|_| WireError::BadLength {
        what: "hash_len",
        expected: 2,
        got: hash_len.len(),
    })?;
    let num_tokens = u32::from_be_bytes(num_tokens);
    let hash_len = u16::from_be_bytes(hash_len);
    let len = usize::from(hash_len);
    if len > MAX_HASH_LEN {
        return Err(WireError::HashTooLong {
            len,
            max: MAX_HASH_LEN,
        });
    }
    let bad_bytes = || WireError::HashBytes {
        hash_len,
        bytes: hashes.len(),
    };
    let count = match hashes.len().checked_div(len) {
        Some(count) if hashes.len() % len == 0 => count,
        None if hashes.is_empty() => 0,
        _ => return Err(bad_bytes()),
    };
    if count > MAX_HASHES {
        return Err(WireError::TooManyHashes {
            count,
            max: MAX_HASHES,
        });
    }
    // A slice of the received frame: no copy.
    let block_hashes = BlockHashes::new(hash_len, hashes.clone()).map_err(|_| bad_bytes())?;
    Ok((num_tokens, block_hashes))
}

/// The hashes of a `msgpack-hex` lookup's frame 1: one array of equal-length hex strings.
fn decode_hex_array(frame: &[u8]) -> Result<BlockHashes, WireError> {
    let mut rest = frame;
    let count =
        rmp::decode::read_array_len(&mut rest).map_err(|e| WireError::Msgpack(e.to_string()))?;
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count > MAX_HASHES {
        return Err(WireError::TooManyHashes {
            count,
            max: MAX_HASHES,
        });
    }
    if count == 0 {
        return finish_array(rest, BlockHashes::empty());
    }
    let mut data: Vec<u8> = Vec::new();
    let mut hex_len = 0;
    for index in 0..count {
        let len =
            rmp::decode::read_str_len(&mut rest).map_err(|e| WireError::Msgpack(e.to_string()))?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if index == 0 {
            if len == 0 {
                return Err(WireError::EmptyHash { index });
            }
            if len % 2 != 0 {
                return Err(WireError::BadHex { index });
            }
            if len / 2 > MAX_HASH_LEN {
                return Err(WireError::HashTooLong {
                    len: len / 2,
                    max: MAX_HASH_LEN,
                });
            }
            // Every later string needs at least a 1-byte header and `len` digits. Check
            // that the frame can hold all of them before sizing the buffer: then the
            // buffer is never larger than half the frame.
            let needed = len + (count - 1) * (len + 1);
            if needed > rest.len() {
                return Err(WireError::Truncated {
                    needed,
                    available: rest.len(),
                });
            }
            hex_len = len;
            data.reserve_exact(count * (len / 2));
        } else if len != hex_len {
            return Err(WireError::UnequalHashLengths { index });
        }
        let Some((digits, tail)) = rest.split_at_checked(len) else {
            return Err(WireError::Truncated {
                needed: len,
                available: rest.len(),
            });
        };
        rest = tail;
        for pair in digits.chunks_exact(2) {
            match (hex_digit(pair[0]), hex_digit(pair[1])) {
                (Some(high), Some(low)) => data.push((high << 4) | low),
                _ => return Err(WireError::BadHex { index }),
            }
        }
    }
    // hex_len / 2 <= MAX_HASH_LEN, which fits a u16.
    let hash_len = u16::try_from(hex_len / 2).unwrap_or(u16::MAX);
    let bytes = data.len();
    let block_hashes = BlockHashes::new(hash_len, Bytes::from(data))
        .map_err(|_| WireError::HashBytes { hash_len, bytes })?;
    finish_array(rest, block_hashes)
}

/// `block_hashes`, unless bytes follow the array.
fn finish_array(rest: &[u8], block_hashes: BlockHashes) -> Result<BlockHashes, WireError> {
    if rest.is_empty() {
        Ok(block_hashes)
    } else {
        Err(WireError::TrailingBytes(rest.len()))
    }
}

/// The value of one ASCII hex digit, either case.
fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Encodes a lookup reply frame.
///
/// - `tagged-blob`: `hit_tokens` u32 BE, then each boundary as `group_id` u32 BE and
///   `boundary_tokens` u32 BE: 4 + 8 × `boundaries.len()` bytes.
/// - `msgpack-hex`: `hit_tokens` u32 BE only, 4 bytes; boundaries are dropped, the
///   format has no room for them.
///
/// (`spec/wire.md`, lookup reply of each format.)
#[must_use]
pub fn encode_lookup_reply(format: Format, reply: &LookupReply) -> Bytes {
    let boundaries: &[TailKeyBoundary] = match format {
        Format::TaggedBlob => &reply.boundaries,
        Format::MsgpackHex => &[],
    };
    let mut out = BytesMut::with_capacity(HIT_BYTES + BOUNDARY_BYTES * boundaries.len());
    out.put_u32(reply.hit_tokens);
    for boundary in boundaries {
        out.put_u32(boundary.group_id);
        out.put_u32(boundary.boundary_tokens);
    }
    out.freeze()
}

/// Encodes the reply to a lookup the server could not ask its store about (master
/// down, timed out, no leader): `spec/wire.md`, "Store unavailable", an extension.
///
/// - `tagged-blob`: the single byte `0x00`, vLLM's `RESP_ERR`. vLLM 0.33's
///   `decode_lookup_response` raises `ValueError` on a reply shorter than 4 bytes and
///   its `LookupKeyClient.lookup` answers 0 hit tokens on any exception, so vLLM reads
///   it as 0, as it reads its own server's answer to a failed store; this project's
///   client reads it as unavailable ([`WireError::StoreUnavailable`]).
/// - `msgpack-hex`: the same single byte. vLLM's older `LookupKeyClient.lookup`
///   (`mooncake_store_scheduler.py` before vLLM #45659) reads any reply as
///   `int.from_bytes(resp, "big")`, so it reads `0x00` as 0 hit tokens, as it read its
///   own server's answer to a failed store; this project's client reads it as
///   unavailable.
///
/// `format` is taken for symmetry with [`encode_lookup_reply`]: both formats answer
/// the same byte.
#[must_use]
pub fn encode_store_unavailable(format: Format) -> Bytes {
    const ERR: &[u8] = &[STORE_UNAVAILABLE];
    let _ = format;
    Bytes::from_static(ERR)
}

/// Encodes a reset reply: the single byte `0x01` when the store was wiped (`ok`),
/// `0x00` when it failed (`spec/wire.md`, `tagged-blob`, reset).
#[must_use]
pub fn encode_reset_reply(ok: bool) -> Bytes {
    const OK: &[u8] = &[RESET_OK];
    const FAILED: &[u8] = &[RESET_FAILED];
    Bytes::from_static(if ok { OK } else { FAILED })
}

/// The reply to an unknown tag: the single byte `0x00` (`spec/wire.md`, `tagged-blob`,
/// unknown tag).
#[must_use]
pub fn unknown_tag_reply() -> Bytes {
    encode_reset_reply(false)
}
