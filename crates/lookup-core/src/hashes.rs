//! Block hashes of a request: the chained per-block keys the store is asked about.

use bytes::Bytes;

use crate::Error;

/// The block hashes of one request, concatenated, each exactly `hash_len` bytes.
///
/// Shape: `len() * hash_len()` bytes in one [`Bytes`], so cloning is a reference
/// count and never copies. vLLM's hashes are chained (each covers its parent), so the
/// pair (number of hashes, last hash) identifies the whole chain
/// (`spec/behaviour.md`, vocabulary); [`BlockHashes::same_chain`] uses exactly that.
///
/// `hash_len` is 0 when there are no hashes, as on the wire (`spec/wire.md`,
/// `tagged-blob` frame 2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockHashes {
    hash_len: u16,
    data: Bytes,
}

impl BlockHashes {
    /// No hashes (`hash_len` 0).
    #[must_use]
    pub fn empty() -> Self {
        Self::default()
    }

    /// Wraps `data`, the concatenation of hashes of `hash_len` bytes each.
    ///
    /// # Errors
    /// [`Error::BadHashes`] when `hash_len` is 0 but `data` is not empty, or when
    /// `data.len()` is not a multiple of `hash_len`. An empty `data` always gives
    /// the empty chain (its `hash_len` is reported as 0).
    pub fn new(hash_len: u16, data: Bytes) -> Result<Self, Error> {
        if data.is_empty() {
            return Ok(Self::empty());
        }
        if hash_len == 0 || data.len() % usize::from(hash_len) != 0 {
            return Err(Error::BadHashes {
                hash_len,
                bytes: data.len(),
            });
        }
        Ok(Self { hash_len, data })
    }

    /// Builds a chain from separate hashes, all of the same length.
    ///
    /// # Errors
    /// [`Error::BadHashes`] when the hashes differ in length, one is empty, or one is
    /// longer than `u16::MAX` bytes.
    pub fn from_hashes<H: AsRef<[u8]>>(hashes: &[H]) -> Result<Self, Error> {
        let Some(first) = hashes.first() else {
            return Ok(Self::empty());
        };
        let len = first.as_ref().len();
        let hash_len = u16::try_from(len).map_err(|_| Error::BadHashes {
            hash_len: u16::MAX,
            bytes: len,
        })?;
        let mut data = Vec::with_capacity(len * hashes.len());
        for h in hashes {
            let h = h.as_ref();
            if h.len() != len {
                return Err(Error::BadHashes {
                    hash_len,
                    bytes: h.len(),
                });
            }
            data.extend_from_slice(h);
        }
        Self::new(hash_len, Bytes::from(data))
    }

    /// Builds a chain of 8-byte big-endian hashes from integer block ids, as in the
    /// Mooncake traces' `hash_ids` (one id per block, already chained).
    #[must_use]
    pub fn from_u64s(ids: &[u64]) -> Self {
        if ids.is_empty() {
            return Self::empty();
        }
        let mut data = Vec::with_capacity(ids.len() * 8);
        for id in ids {
            data.extend_from_slice(&id.to_be_bytes());
        }
        Self {
            hash_len: 8,
            data: Bytes::from(data),
        }
    }

    /// Byte length of each hash; 0 when there are none.
    #[must_use]
    pub fn hash_len(&self) -> u16 {
        self.hash_len
    }

    /// Number of hashes (blocks).
    #[must_use]
    pub fn len(&self) -> usize {
        if self.hash_len == 0 {
            0
        } else {
            self.data.len() / usize::from(self.hash_len)
        }
    }

    /// True when there are no hashes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// All hashes concatenated (`len() * hash_len()` bytes).
    #[must_use]
    pub fn as_bytes(&self) -> &Bytes {
        &self.data
    }

    /// Hash `i` (0-based), or `None` past the end.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let n = usize::from(self.hash_len);
        if i >= self.len() {
            return None;
        }
        Some(&self.data[i * n..(i + 1) * n])
    }

    /// The last hash, which with [`len`](Self::len) identifies a chained sequence.
    #[must_use]
    pub fn last(&self) -> Option<&[u8]> {
        // The last `hash_len` bytes: no division (a probe compares chains by it).
        if self.data.is_empty() {
            return None;
        }
        Some(&self.data[self.data.len() - usize::from(self.hash_len)..])
    }

    /// Iterates over the hashes in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.into_iter()
    }

    /// True when `other` is the same chain: same hash length, same count and same
    /// last hash. Hashes are chained, so this identifies the whole chain without
    /// comparing every block (`spec/behaviour.md`, vocabulary). Never allocates; two
    /// clones of one chain (the same bytes) compare without reading a hash.
    #[must_use]
    pub fn same_chain(&self, other: &Self) -> bool {
        self.hash_len == other.hash_len
            && self.data.len() == other.data.len()
            && (self.data.as_ptr() == other.data.as_ptr() || self.last() == other.last())
    }
}

/// The hashes in order, each `hash_len` bytes: what a key layout turns into store keys
/// (`mooncake_master::key::KeyLayout::chain_keys` takes `&BlockHashes`).
impl<'a> IntoIterator for &'a BlockHashes {
    type Item = &'a [u8];
    type IntoIter = std::slice::ChunksExact<'a, u8>;

    fn into_iter(self) -> Self::IntoIter {
        let n = usize::from(self.hash_len.max(1));
        self.data.chunks_exact(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_is_the_final_hash_and_none_when_empty() {
        let chain = BlockHashes::from_u64s(&[1, 2, 3]);
        assert_eq!(chain.last(), Some(&3u64.to_be_bytes()[..]));
        assert_eq!(
            BlockHashes::from_u64s(&[9]).last(),
            Some(&9u64.to_be_bytes()[..])
        );
        assert_eq!(BlockHashes::empty().last(), None);
    }

    #[test]
    fn same_chain_compares_length_count_and_last_hash() {
        let chain = BlockHashes::from_u64s(&[1, 2, 3]);
        // A clone shares the bytes; a copy has its own.
        assert!(chain.same_chain(&chain.clone()));
        assert!(chain.same_chain(&BlockHashes::from_u64s(&[1, 2, 3])));
        // Chained hashes: an equal last hash at an equal count is the same chain.
        assert!(chain.same_chain(&BlockHashes::from_u64s(&[7, 8, 3])));
        assert!(!chain.same_chain(&BlockHashes::from_u64s(&[1, 2, 4])));
        assert!(!chain.same_chain(&BlockHashes::from_u64s(&[2, 3])));
        // A prefix of the same bytes starts at the same address: still not the same.
        let prefix = BlockHashes::new(8, chain.as_bytes().slice(..16)).unwrap();
        assert!(!chain.same_chain(&prefix));
        let wide = BlockHashes::new(12, chain.as_bytes().clone()).unwrap();
        assert_eq!(wide.len(), 2);
        assert!(!chain.same_chain(&wide));
        assert!(BlockHashes::empty().same_chain(&BlockHashes::empty()));
        assert!(!BlockHashes::empty().same_chain(&chain));
    }
}
