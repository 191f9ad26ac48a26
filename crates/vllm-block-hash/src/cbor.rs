//! The bytes `cbor2.dumps(obj, canonical=True)` writes for the values vLLM's
//! `sha256_cbor` block hash feeds it (vllm/utils/hashing.py `sha256_cbor`), written
//! with `ciborium`.
//!
//! For these values canonical CBOR is plain CBOR with shortest heads: Python tuples
//! are definite-length arrays, `bytes` major type 2, `str` major type 3 (UTF-8),
//! `None` the simple value `0xf6`, and `int` major type 0 or 1 with the shortest
//! argument. `canonical=True` only changes maps, sets and floats, none of which occur
//! here, and cbor2 shares no values (no `value_sharing`, no string references).
//! `ciborium` writes exactly these heads (always the shortest), checked byte for byte
//! against cbor2 by the golden vectors.

use serde::ser::{Serialize, SerializeTuple, Serializer};

use crate::Error;
use crate::extra_keys::ExtraKey;

/// A `bytes` value (serde would otherwise write a slice as an array of integers).
struct ByteString<'a>(&'a [u8]);

impl Serialize for ByteString<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// `(parent, tuple(tokens), extra_keys)`.
struct BlockInput<'a> {
    parent: &'a [u8],
    tokens: &'a [u32],
    extra_keys: &'a [ExtraKey],
}

impl Serialize for BlockInput<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&ByteString(self.parent))?;
        t.serialize_element(self.tokens)?;
        if self.extra_keys.is_empty() {
            t.serialize_element(&None::<()>)?;
        } else {
            t.serialize_element(&ExtraKeys(self.extra_keys))?;
        }
        t.end()
    }
}

struct ExtraKeys<'a>(&'a [ExtraKey]);

impl Serialize for ExtraKeys<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(self.0.len())?;
        for key in self.0 {
            t.serialize_element(key)?;
        }
        t.end()
    }
}

impl Serialize for ExtraKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Lora { name, path } => ("lora", name, path).serialize(s),
            Self::Mm { identifier, offset } => ("mm", identifier, offset).serialize(s),
            Self::CacheSalt(salt) => ("cache_salt", salt).serialize(s),
            Self::PromptEmbeds(digest) => ("prompt_embeds", ByteString(digest)).serialize(s),
        }
    }
}

fn encode<T: Serialize>(value: &T, capacity: usize) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(capacity);
    ciborium::into_writer(value, &mut out).map_err(|e| Error::Cbor(e.to_string()))?;
    Ok(out)
}

/// `cbor2.dumps((parent, tuple(tokens), extra_keys), canonical=True)`.
///
/// # Errors
/// [`Error::Cbor`] if the encoder fails, which writing these values to memory never
/// does.
pub(crate) fn block_input(
    parent: &[u8],
    tokens: &[u32],
    extra_keys: &[ExtraKey],
) -> Result<Vec<u8>, Error> {
    let extra_len: usize = extra_keys.iter().map(ExtraKey::payload_len).sum();
    let input = BlockInput {
        parent,
        tokens,
        extra_keys,
    };
    encode(&input, parent.len() + 5 * tokens.len() + extra_len + 16)
}

/// `cbor2.dumps(seed, canonical=True)` of the `NONE_HASH` seed string.
///
/// # Errors
/// As [`block_input`].
pub(crate) fn seed(seed: &str) -> Result<Vec<u8>, Error> {
    encode(&seed, seed.len() + 9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn heads_are_shortest() {
        // cbor2 6.2.1: cbor2.dumps((b"\x01", (0, 23, 24, 255, 256, 65536, 4294967295),
        //   (("mm", "i", -1), ("mm", "j", -25))), canonical=True).hex()
        let keys = [
            ExtraKey::Mm {
                identifier: "i".to_owned(),
                offset: -1,
            },
            ExtraKey::Mm {
                identifier: "j".to_owned(),
                offset: -25,
            },
        ];
        let bytes = block_input(&[1], &[0, 23, 24, 255, 256, 65536, u32::MAX], &keys).unwrap();
        assert_eq!(
            hex(&bytes),
            "834101870017181818ff1901001a000100001affffffff8283626d6d61692083626d6d616a3818"
        );
        assert_eq!(hex(&seed("0").unwrap()), "6130");
        assert_eq!(hex(&block_input(&[], &[], &[]).unwrap()), "834080f6");
    }
}
