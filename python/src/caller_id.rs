//! `CallerId`: a caller's request id as the native client's table keys it. vLLM's ids
//! (`chatcmpl-<16 hex>-<8 hex>`, 34 bytes; `cmpl-...` and others of the same order)
//! fit inline (46 bytes), so a table probe compares the key inside the bucket it already read,
//! with no pointer to follow: on a poll the key compare of a heap `String` was a
//! third of the lookup's time (a cache miss per call). Longer ids go to the heap.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

/// Inline capacity in bytes: vLLM's ids with room to spare; with the length and the
/// enum's tag a key is 48 bytes of the bucket.
const INLINE: usize = 46;

/// A caller id, compared, hashed and borrowed as its UTF-8 bytes (so the table is
/// probed with `id.as_bytes()`, and a compare reads bytes without validating them).
pub(crate) enum CallerId {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl CallerId {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(s) => s.as_bytes(),
        }
    }
}

impl From<&str> for CallerId {
    fn from(s: &str) -> Self {
        match u8::try_from(s.len()) {
            Ok(len) if s.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..s.len()].copy_from_slice(s.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(s.into()),
        }
    }
}

impl Borrow<[u8]> for CallerId {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Hash for CallerId {
    // As `[u8]` hashes: `Borrow<[u8]>` requires it.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq for CallerId {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for CallerId {}

impl std::fmt::Debug for CallerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        String::from_utf8_lossy(self.as_bytes()).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lookup_core::Table;

    #[test]
    fn inline_and_heap_ids_key_the_table_as_their_str() {
        let short = "chatcmpl-0123456789abcdef-01234567";
        let edge = "x".repeat(INLINE);
        let long = "y".repeat(INLINE + 1);
        let mut table: Table<CallerId, u32> = Table::default();
        for (i, id) in [short, edge.as_str(), long.as_str(), ""].iter().enumerate() {
            table.insert(CallerId::from(*id), u32::try_from(i).expect("small"));
        }
        assert!(matches!(
            CallerId::from(short),
            CallerId::Inline { len: 34, .. }
        ));
        assert!(matches!(
            CallerId::from(edge.as_str()),
            CallerId::Inline { len: 46, .. }
        ));
        assert_eq!(size_of::<CallerId>(), 48);
        assert!(matches!(CallerId::from(long.as_str()), CallerId::Heap(_)));
        assert_eq!(table.get(short.as_bytes()), Some(&0));
        assert_eq!(table.get(edge.as_bytes()), Some(&1));
        assert_eq!(table.get(long.as_bytes()), Some(&2));
        assert_eq!(table.get(&b""[..]), Some(&3));
        assert_eq!(table.get(&b"chatcmpl-0123456789abcdef-0123456"[..]), None);
        assert_eq!(CallerId::from("é-ü").as_bytes(), "é-ü".as_bytes());
        assert_eq!(format!("{:?}", CallerId::from("é-ü")), "\"é-ü\"");
    }
}
