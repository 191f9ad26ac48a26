//! The bytes CPython 3's `pickle.dumps(obj, protocol=5)` writes for the values vLLM's
//! `sha256` block hash feeds it (vllm/utils/hashing.py `sha256`): the tuple
//! `(parent_block_hash, token_ids, extra_keys)` and the `NONE_HASH` seed string.
//!
//! This mirrors CPython's C pickler (`Modules/_pickle.c`), which `pickle.dumps` uses,
//! for exactly the types involved: `None`, `int`, `bytes`, `str` and `tuple`.
//! - Framing (protocol 4+): after `PROTO 5`, output goes into frames `FRAME <u64 len>`;
//!   a frame is closed once it holds at least 64 KiB at the end of saving an object
//!   (`_Pickler_OpcodeBoundary`), a frame under 4 bytes loses its header
//!   (`_Pickler_CommitFrame`), and a `bytes`/`str` payload of 64 KiB or more is
//!   written outside any frame (`_Pickler_write_bytes`).
//! - Memo: every `bytes`, `str` and non-empty tuple is followed by `MEMOIZE`; an
//!   object met again (by identity) is written as `BINGET n` / `LONG_BINGET n`. In a
//!   block hash input the only objects met twice are vLLM's tag literals (`"mm"` when a
//!   block holds several multi-modal items): code constants, one object each. Every
//!   other string reaches the engine msgspec-decoded, one object per field, so it is
//!   never shared, and this encoder never shares it.
//! - Integers: `BININT1` (0..=255), `BININT2` (256..=65535), `BININT` (the rest of the
//!   signed 32-bit range), else `LONG1` with the minimal little-endian two's
//!   complement.

use crate::extra_keys::ExtraKey;

const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const NONE: u8 = b'N';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const BINBYTES8: u8 = 0x8e;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const EMPTY_TUPLE: u8 = b')';
const TUPLE_N: [u8; 3] = [0x85, 0x86, 0x87];

/// `FRAME_SIZE_TARGET` in `_pickle.c`: frames close past this size, larger payloads
/// bypass frames.
const FRAME_SIZE_TARGET: usize = 64 * 1024;
/// `FRAME_SIZE_MIN`: a shorter frame is written without its header.
const FRAME_SIZE_MIN: usize = 4;
/// `FRAME` opcode plus its 8-byte length.
const FRAME_HEADER_SIZE: usize = 9;

/// The tag literals vLLM puts first in each extra key, one memo slot each.
#[derive(Clone, Copy)]
enum Tag {
    Lora,
    Mm,
    CacheSalt,
    PromptEmbeds,
}

impl Tag {
    fn text(self) -> &'static str {
        match self {
            Self::Lora => "lora",
            Self::Mm => "mm",
            Self::CacheSalt => "cache_salt",
            Self::PromptEmbeds => "prompt_embeds",
        }
    }
}

struct Pickler {
    out: Vec<u8>,
    /// Offset of the open frame's reserved header, if a frame is open.
    frame_start: Option<usize>,
    framing: bool,
    memo_len: u32,
    /// Memo index of each tag once written, indexed by `Tag as usize`.
    tags: [Option<u32>; 4],
}

impl Pickler {
    fn new(capacity: usize) -> Self {
        let mut out = Vec::with_capacity(capacity + 2 + FRAME_HEADER_SIZE + 1);
        out.extend_from_slice(&[PROTO, 5]);
        Self {
            out,
            frame_start: None,
            framing: true,
            memo_len: 0,
            tags: [None; 4],
        }
    }

    /// `_Pickler_Write`: opens a frame when framing and none is open.
    fn write(&mut self, data: &[u8]) {
        if self.framing && self.frame_start.is_none() {
            self.frame_start = Some(self.out.len());
            self.out.extend_from_slice(&[0; FRAME_HEADER_SIZE]);
        }
        self.out.extend_from_slice(data);
    }

    /// `_Pickler_CommitFrame`.
    fn commit_frame(&mut self) {
        if !self.framing {
            return;
        }
        let Some(start) = self.frame_start.take() else {
            return;
        };
        let len = self.out.len() - start - FRAME_HEADER_SIZE;
        if len >= FRAME_SIZE_MIN {
            self.out[start] = FRAME;
            self.out[start + 1..start + FRAME_HEADER_SIZE]
                .copy_from_slice(&(len as u64).to_le_bytes());
        } else {
            self.out.drain(start..start + FRAME_HEADER_SIZE);
        }
    }

    /// `_Pickler_OpcodeBoundary`, run when an object is saved.
    fn boundary(&mut self) {
        if let (true, Some(start)) = (self.framing, self.frame_start)
            && self.out.len() - start - FRAME_HEADER_SIZE >= FRAME_SIZE_TARGET
        {
            self.commit_frame();
        }
    }

    /// `_Pickler_write_bytes`: a large payload goes outside any frame.
    fn write_payload(&mut self, header: &[u8], data: &[u8]) {
        let framing = self.framing;
        if data.len() >= FRAME_SIZE_TARGET {
            self.commit_frame();
            self.framing = false;
        }
        self.write(header);
        self.write(data);
        self.framing = framing;
    }

    /// `memo_put`; returns the object's memo index.
    fn memoize(&mut self) -> u32 {
        self.write(&[MEMOIZE]);
        let index = self.memo_len;
        self.memo_len += 1;
        index
    }

    fn save_none(&mut self) {
        self.write(&[NONE]);
        self.boundary();
    }

    /// `save_long`.
    fn save_int(&mut self, value: i64) {
        if let Ok(v) = i32::try_from(value) {
            let b = v.to_le_bytes();
            if b[3] != 0 || b[2] != 0 {
                self.write(&[BININT, b[0], b[1], b[2], b[3]]);
            } else if b[1] != 0 {
                self.write(&[BININT2, b[0], b[1]]);
            } else {
                self.write(&[BININT1, b[0]]);
            }
        } else {
            // nbytes = bit length of |value| / 8 + 1, then one byte fewer when the
            // top byte is only sign extension of a negative number.
            let bits = 64 - value.unsigned_abs().leading_zeros() as usize;
            let mut n = bits / 8 + 1;
            let le = i128::from(value).to_le_bytes();
            if value < 0 && n > 1 && le[n - 1] == 0xff && le[n - 2] & 0x80 != 0 {
                n -= 1;
            }
            // n <= 9 for an i64, so it fits LONG1's one-byte length.
            self.write(&[LONG1, n as u8]);
            self.write(&le[..n]);
        }
        self.boundary();
    }

    /// `_save_bytes_data`.
    fn save_bytes(&mut self, data: &[u8]) {
        let (header, len) = size_header(data.len(), SHORT_BINBYTES, BINBYTES, BINBYTES8);
        self.write_payload(&header[..len], data);
        self.memoize();
        self.boundary();
    }

    /// `write_unicode_binary` (UTF-8, as `str` has no lone surrogates in Rust).
    fn save_str(&mut self, text: &str) -> u32 {
        let data = text.as_bytes();
        let (header, len) = size_header(data.len(), SHORT_BINUNICODE, BINUNICODE, BINUNICODE8);
        self.write_payload(&header[..len], data);
        let index = self.memoize();
        self.boundary();
        index
    }

    /// A tag literal: written once, then fetched from the memo (`memo_get`).
    fn save_tag(&mut self, tag: Tag) {
        if let Some(index) = self.tags[tag as usize] {
            match u8::try_from(index) {
                Ok(i) => self.write(&[BINGET, i]),
                Err(_) => {
                    let b = index.to_le_bytes();
                    self.write(&[LONG_BINGET, b[0], b[1], b[2], b[3]]);
                }
            }
            self.boundary();
        } else {
            self.tags[tag as usize] = Some(self.save_str(tag.text()));
        }
    }

    /// `save_tuple` of `len` elements written by `elements`.
    fn save_tuple(&mut self, len: usize, elements: impl FnOnce(&mut Self)) {
        if len == 0 {
            self.write(&[EMPTY_TUPLE]);
            self.boundary();
            return;
        }
        if len <= 3 {
            elements(self);
            self.write(&[TUPLE_N[len - 1]]);
        } else {
            self.write(&[MARK]);
            elements(self);
            self.write(&[TUPLE]);
        }
        self.memoize();
        self.boundary();
    }

    fn save_extra_key(&mut self, key: &ExtraKey) {
        match key {
            ExtraKey::Lora { name, path } => self.save_tuple(3, |p| {
                p.save_tag(Tag::Lora);
                p.save_str(name);
                p.save_str(path);
            }),
            ExtraKey::Mm { identifier, offset } => self.save_tuple(3, |p| {
                p.save_tag(Tag::Mm);
                p.save_str(identifier);
                p.save_int(*offset);
            }),
            ExtraKey::CacheSalt(salt) => self.save_tuple(2, |p| {
                p.save_tag(Tag::CacheSalt);
                p.save_str(salt);
            }),
            ExtraKey::PromptEmbeds(digest) => self.save_tuple(2, |p| {
                p.save_tag(Tag::PromptEmbeds);
                p.save_bytes(digest);
            }),
        }
    }

    /// `dump`: `STOP` goes into the last frame, which is then committed.
    fn finish(mut self) -> Vec<u8> {
        self.write(&[STOP]);
        self.commit_frame();
        self.out
    }
}

/// The short (1-byte), 4-byte or 8-byte length header of a `bytes`/`str` payload.
fn size_header(size: usize, short: u8, long: u8, long8: u8) -> ([u8; 9], usize) {
    let mut header = [0u8; 9];
    if let Ok(s) = u8::try_from(size) {
        header[0] = short;
        header[1] = s;
        (header, 2)
    } else if let Ok(s) = u32::try_from(size) {
        header[0] = long;
        header[1..5].copy_from_slice(&s.to_le_bytes());
        (header, 5)
    } else {
        header[0] = long8;
        header[1..9].copy_from_slice(&(size as u64).to_le_bytes());
        (header, 9)
    }
}

/// `pickle.dumps((parent, tuple(tokens), extra_keys), protocol=5)`, with
/// `extra_keys` `None` when empty (vLLM's `generate_block_hash_extra_keys`).
pub(crate) fn block_input(parent: &[u8], tokens: &[u32], extra_keys: &[ExtraKey]) -> Vec<u8> {
    let extra_len: usize = extra_keys.iter().map(ExtraKey::payload_len).sum();
    let mut p = Pickler::new(parent.len() + 5 * tokens.len() + extra_len + 64);
    p.save_tuple(3, |p| {
        p.save_bytes(parent);
        p.save_tuple(tokens.len(), |p| {
            for &t in tokens {
                p.save_int(i64::from(t));
            }
        });
        if extra_keys.is_empty() {
            p.save_none();
        } else {
            p.save_tuple(extra_keys.len(), |p| {
                for key in extra_keys {
                    p.save_extra_key(key);
                }
            });
        }
    });
    p.finish()
}

/// `pickle.dumps(seed, protocol=5)` of the `NONE_HASH` seed string.
pub(crate) fn seed(seed: &str) -> Vec<u8> {
    let mut p = Pickler::new(seed.len() + 16);
    p.save_str(seed);
    p.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn dumps_int(value: i64) -> String {
        let mut p = Pickler::new(0);
        p.save_int(value);
        hex(&p.finish())
    }

    #[test]
    fn seed_matches_cpython() {
        // python3 -c 'import pickle; print(pickle.dumps("vllm-none-hash", protocol=5).hex())'
        assert_eq!(
            hex(&seed("vllm-none-hash")),
            "80059512000000000000008c0e766c6c6d2d6e6f6e652d68617368942e"
        );
        // 8c 01 30 94 2e is 5 bytes: still framed.
        assert_eq!(hex(&seed("0")), "80059505000000000000008c0130942e");
    }

    #[test]
    fn integers_use_the_narrowest_opcode_and_short_frames_lose_their_header() {
        // Expected values: `pickle.dumps(v, protocol=5).hex()` on CPython 3.11.
        let cases: [(i64, &str); 14] = [
            (0, "80054b002e"),
            (255, "80054bff2e"),
            (256, "80059504000000000000004d00012e"),
            (65535, "80059504000000000000004dffff2e"),
            (65536, "80059506000000000000004a000001002e"),
            (-1, "80059506000000000000004affffffff2e"),
            (-129, "80059506000000000000004a7fffffff2e"),
            (2_147_483_647, "80059506000000000000004affffff7f2e"),
            (2_147_483_648, "80059508000000000000008a0500000080002e"),
            (4_294_967_295, "80059508000000000000008a05ffffffff002e"),
            (-2_147_483_649, "80059508000000000000008a05ffffff7fff2e"),
            (-549_755_813_888, "80059508000000000000008a0500000000802e"),
            (i64::MIN, "8005950b000000000000008a0800000000000000802e"),
            (i64::MAX, "8005950b000000000000008a08ffffffffffffff7f2e"),
        ];
        for (value, expected) in cases {
            assert_eq!(dumps_int(value), expected, "{value}");
        }
    }
}
