//! The subset of struct_pack the existence RPC needs (`spec/mooncake-master-rpc.md`,
//! "struct_pack"; yalantinglibs' layout document,
//! <https://github.com/alibaba/yalantinglibs/blob/main/website/docs/en/struct_pack/struct_pack_layout.md>):
//! a 4-byte type hash, an optional metainfo byte, an optional NUL-terminated type
//! literal, then the data.

use super::CodecError;

/// A struct_pack type as the RPC uses it: its type literal (the string of type codes)
/// and `MD5_32(literal)` with bit 0 cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackType {
    /// The type literal, without its NUL terminator.
    pub(crate) literal: &'static [u8],
    /// Type hash, bit 0 (the metainfo flag) cleared.
    pub(crate) hash: u32,
}

/// Bit 0 of the type hash on the wire: a metainfo byte follows.
const HAS_METAINFO: u32 = 1;
/// Metainfo bit 2: the type literal follows.
const META_TYPE_LITERAL: u8 = 0b0000_0100;
/// Metainfo bits 3-4: the width of every length prefix.
const META_WIDTH_SHIFT: u8 = 3;
/// Metainfo bits 0-1: the type has `compatible<T>` fields (added by a later version),
/// and the message's total size follows the metainfo byte in 2 (01), 4 (10) or 8 (11)
/// bytes. Compatible fields sit after every other field; a reader that does not know
/// them skips them (struct_pack's forward compatibility). Seen on 0.3.14's
/// `GetReplicaList` reply.
const META_COMPATIBLE: u8 = 0b0000_0011;
/// Metainfo bits this subset does not support: 5-7 (reserved).
const META_UNSUPPORTED: u8 = 0b1110_0000;

/// Whether a message carries its type literal. The PyPI master and client are debug
/// builds and send it; release builds do not; receivers accept both
/// (`spec/mooncake-master-rpc.md`, "struct_pack").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TypeLiteral {
    /// Release form: no literal; the metainfo byte only when lengths need more than
    /// one byte. The shortest encoding; the default.
    #[default]
    Omit,
    /// Debug form: metainfo bit 2 set and the NUL-terminated literal after it.
    Include,
}

/// Width of every length prefix of one message, in bytes, chosen by the sender from
/// the largest string or container length in the whole message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LenWidth {
    One,
    Two,
    Four,
    Eight,
}

impl LenWidth {
    pub(crate) fn for_max(max_len: usize) -> Self {
        let max = max_len as u64;
        if max < 1 << 8 {
            Self::One
        } else if max < 1 << 16 {
            Self::Two
        } else if max < 1 << 32 {
            Self::Four
        } else {
            Self::Eight
        }
    }

    fn bits(self) -> u8 {
        match self {
            Self::One => 0,
            Self::Two => 1,
            Self::Four => 2,
            Self::Eight => 3,
        }
    }

    fn from_bits(bits: u8) -> Self {
        match bits & 3 {
            0 => Self::One,
            1 => Self::Two,
            2 => Self::Four,
            _ => Self::Eight,
        }
    }

    fn bytes(self) -> usize {
        match self {
            Self::One => 1,
            Self::Two => 2,
            Self::Four => 4,
            Self::Eight => 8,
        }
    }
}

/// Appends one struct_pack message to a buffer: the prologue at construction, then
/// the data field by field.
pub(crate) struct PackWriter<'a> {
    out: &'a mut Vec<u8>,
    width: LenWidth,
}

impl<'a> PackWriter<'a> {
    /// Writes the type hash, the metainfo byte when needed and the literal when asked;
    /// `max_len` is the largest string or container length the data will hold.
    pub(crate) fn begin(
        out: &'a mut Vec<u8>,
        ty: PackType,
        literal: TypeLiteral,
        max_len: usize,
    ) -> Self {
        let width = LenWidth::for_max(max_len);
        let mut meta = width.bits() << META_WIDTH_SHIFT;
        if literal == TypeLiteral::Include {
            meta |= META_TYPE_LITERAL;
        }
        // With 1-byte lengths and no literal every metainfo field is at its default,
        // and struct_pack leaves the byte out.
        let hash = if meta == 0 {
            ty.hash & !HAS_METAINFO
        } else {
            ty.hash | HAS_METAINFO
        };
        out.extend_from_slice(&hash.to_le_bytes());
        if meta != 0 {
            out.push(meta);
        }
        if literal == TypeLiteral::Include {
            out.extend_from_slice(ty.literal);
            out.push(0);
        }
        Self { out, width }
    }

    /// A length prefix (string bytes or container elements) in the message's width.
    pub(crate) fn len(&mut self, len: usize) {
        let len = len as u64;
        match self.width {
            LenWidth::One => self.out.push(len as u8),
            LenWidth::Two => self.out.extend_from_slice(&(len as u16).to_le_bytes()),
            LenWidth::Four => self.out.extend_from_slice(&(len as u32).to_le_bytes()),
            LenWidth::Eight => self.out.extend_from_slice(&len.to_le_bytes()),
        }
    }

    /// A string: its length in bytes, then the bytes.
    pub(crate) fn str(&mut self, s: &str) {
        self.len(s.len());
        self.out.extend_from_slice(s.as_bytes());
    }

    /// A bool: one byte, 0 or 1.
    pub(crate) fn bool(&mut self, v: bool) {
        self.out.push(u8::from(v));
    }

    /// An `i32` (struct_pack enums such as `ErrorCode`), little-endian.
    pub(crate) fn i32(&mut self, v: i32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// An `i64` (`long` on LP64), little-endian.
    pub(crate) fn i64(&mut self, v: i64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// A `u16`, little-endian.
    pub(crate) fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// A `u8` (a variant's index).
    pub(crate) fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    /// A `u64`, little-endian.
    pub(crate) fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Reads one struct_pack message. Every read is bounded by the bytes that remain, so
/// a hostile length can neither panic nor make it allocate more than the input's size.
pub(crate) struct PackReader<'a> {
    buf: &'a [u8],
    pos: usize,
    width: LenWidth,
    /// The message declared its total size (it has `compatible` fields): bytes left
    /// once the known fields are read are those fields, skipped by [`Self::finish`].
    compatible: bool,
}

impl<'a> PackReader<'a> {
    /// Reads the prologue. `ty` is checked when given: the hash on bits 1-31 only (bit 0
    /// is the metainfo flag) and the literal, when present, byte for byte. `None`
    /// skips both checks (for error messages, whose exact type is not pinned down).
    pub(crate) fn open(buf: &'a [u8], ty: Option<PackType>) -> Result<Self, CodecError> {
        match ty {
            Some(ty) => Ok(Self::open_any(buf, &[ty])?.0),
            None => Self::open_with(buf, |_| Ok(None)).map(|(r, _)| r),
        }
    }

    /// Reads the prologue of a message that may be any of `types` (the layouts of
    /// several master versions): the hash picks one, whose literal is then checked
    /// when present. Returns the reader and the index of the type in `types`.
    pub(crate) fn open_any(buf: &'a [u8], types: &[PackType]) -> Result<(Self, usize), CodecError> {
        let (r, index) = Self::open_with(buf, |hash| {
            types
                .iter()
                .position(|ty| (hash ^ ty.hash) & !HAS_METAINFO == 0)
                .map(|i| Some((i, types[i].literal)))
                .ok_or(CodecError::TypeHashMismatch {
                    expected: types.first().map_or(0, |ty| ty.hash),
                    got: hash & !HAS_METAINFO,
                })
        })?;
        Ok((r, index.unwrap_or(0)))
    }

    /// The prologue; `pick(hash)` names the expected type's index and literal (or
    /// `None` for no check), or refuses the hash.
    fn open_with(
        buf: &'a [u8],
        pick: impl Fn(u32) -> Result<Option<(usize, &'static [u8])>, CodecError>,
    ) -> Result<(Self, Option<usize>), CodecError> {
        let mut r = Self {
            buf,
            pos: 0,
            width: LenWidth::One,
            compatible: false,
        };
        let hash = u32::from_le_bytes(r.array::<4>()?);
        let expected = pick(hash)?;
        if hash & HAS_METAINFO != 0 {
            let [meta] = r.array::<1>()?;
            if meta & META_UNSUPPORTED != 0 {
                return Err(CodecError::UnsupportedMetainfo(meta));
            }
            r.width = LenWidth::from_bits(meta >> META_WIDTH_SHIFT);
            if meta & META_COMPATIBLE != 0 {
                let size = match meta & META_COMPATIBLE {
                    1 => u64::from(u16::from_le_bytes(r.array::<2>()?)),
                    2 => u64::from(u32::from_le_bytes(r.array::<4>()?)),
                    _ => u64::from_le_bytes(r.array::<8>()?),
                };
                // The total covers the whole message, prologue included.
                let total = buf.len() as u64;
                if size > total {
                    return Err(CodecError::Truncated {
                        needed: usize::try_from(size - total).unwrap_or(usize::MAX),
                        remaining: 0,
                    });
                }
                if size < total {
                    return Err(CodecError::TrailingBytes {
                        count: usize::try_from(total - size).unwrap_or(usize::MAX),
                    });
                }
                r.compatible = true;
            }
            if meta & META_TYPE_LITERAL != 0 {
                let rest = &r.buf[r.pos..];
                let end = rest
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or(CodecError::UnterminatedTypeLiteral)?;
                let literal = &rest[..end];
                if let Some((_, want)) = expected
                    && literal != want
                {
                    return Err(CodecError::TypeLiteralMismatch {
                        expected: want,
                        got: literal.to_vec(),
                    });
                }
                r.pos += end + 1;
            }
        }
        Ok((r, expected.map(|(i, _)| i)))
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if n > self.remaining() {
            return Err(CodecError::Truncated {
                needed: n,
                remaining: self.remaining(),
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let bytes = self.take(N)?;
        let mut out = [0; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn len(&mut self) -> Result<u64, CodecError> {
        let bytes = self.take(self.width.bytes())?;
        let mut le = [0u8; 8];
        le[..bytes.len()].copy_from_slice(bytes);
        Ok(u64::from_le_bytes(le))
    }

    /// A container's element count, checked against the bytes left: every element
    /// takes at least `min_element_bytes` (> 0), so a count that cannot fit is an error
    /// before anything is allocated.
    pub(crate) fn count(&mut self, min_element_bytes: usize) -> Result<usize, CodecError> {
        let count = self.len()?;
        let needed = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(min_element_bytes))
            .ok_or(CodecError::LengthOverflow { length: count })?;
        if needed > self.remaining() {
            return Err(CodecError::Truncated {
                needed,
                remaining: self.remaining(),
            });
        }
        Ok(count as usize)
    }

    /// A string's bytes; not UTF-8 checked (keys and messages are bytes to the master).
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let len = self.len()?;
        let len = usize::try_from(len).map_err(|_| CodecError::LengthOverflow { length: len })?;
        self.take(len)
    }

    /// A string, invalid UTF-8 replaced (it is only ever shown to people).
    pub(crate) fn string_lossy(&mut self) -> Result<String, CodecError> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }

    /// A bool: any non-zero byte is true, as struct_pack reads it.
    pub(crate) fn bool(&mut self) -> Result<bool, CodecError> {
        Ok(self.array::<1>()?[0] != 0)
    }

    /// An `i32`, little-endian.
    pub(crate) fn i32(&mut self) -> Result<i32, CodecError> {
        Ok(i32::from_le_bytes(self.array::<4>()?))
    }

    /// An `i64`, little-endian.
    pub(crate) fn i64(&mut self) -> Result<i64, CodecError> {
        Ok(i64::from_le_bytes(self.array::<8>()?))
    }

    /// A `u16`, little-endian.
    pub(crate) fn u16(&mut self) -> Result<u16, CodecError> {
        Ok(u16::from_le_bytes(self.array::<2>()?))
    }

    /// A `u8` (a variant's index).
    pub(crate) fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.array::<1>()?[0])
    }

    /// A `u64`, little-endian.
    pub(crate) fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.array::<8>()?))
    }

    /// Ends the message: every byte must have been read, but for the `compatible`
    /// fields of a message that declared its total size (a later version's additions,
    /// skipped as struct_pack's own readers skip them).
    pub(crate) fn finish(self) -> Result<(), CodecError> {
        match self.remaining() {
            0 => Ok(()),
            _ if self.compatible => Ok(()),
            count => Err(CodecError::TrailingBytes { count }),
        }
    }
}
