//! vLLM 0.33's prefix-cache block hash: the algorithm choice, `NONE_HASH`, one block
//! (`hash_block_tokens`) and a request's chain (`get_request_block_hasher`), all in
//! vllm/v1/core/kv_cache_utils.py and vllm/utils/hashing.py.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use lookup_core::BlockHashes;
use sha2::{Digest, Sha256};

use crate::extra_keys::{ExtraKey, RequestExtraKeys};
use crate::{BlockHash, Error, HASH_LEN, cbor, pickle};

/// vLLM's `--prefix-caching-hash-algo` (`CacheConfig.prefix_caching_hash_algo`), the
/// two supported here.
///
/// `xxhash` and `xxhash_cbor` are not supported: their `NONE_HASH` is random per
/// process unless `PYTHONHASHSEED` is set, so engines using them share no keys by
/// default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HashAlgo {
    /// `"sha256"`, vLLM's default: SHA-256 of `pickle.dumps(obj, protocol=5)`.
    #[default]
    Sha256,
    /// `"sha256_cbor"`: SHA-256 of `cbor2.dumps(obj, canonical=True)`.
    Sha256Cbor,
}

impl HashAlgo {
    /// The name vLLM's configuration uses.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha256Cbor => "sha256_cbor",
        }
    }

    /// The serialized bytes of `(parent, tuple(tokens), extra_keys)` that this
    /// algorithm hashes, `extra_keys` being `None` when empty.
    ///
    /// # Errors
    /// [`Error::Cbor`] if the CBOR encoder fails (it does not for these values).
    pub fn block_input(
        self,
        parent: &BlockHash,
        block_tokens: &[u32],
        extra_keys: &[ExtraKey],
    ) -> Result<Vec<u8>, Error> {
        match self {
            Self::Sha256 => Ok(pickle::block_input(parent, block_tokens, extra_keys)),
            Self::Sha256Cbor => cbor::block_input(parent, block_tokens, extra_keys),
        }
    }

    /// `NONE_HASH = hash_fn(seed)`: the parent hash of a request's first block.
    ///
    /// # Errors
    /// As [`block_input`](Self::block_input).
    pub fn none_hash(self, seed: &NoneHashSeed) -> Result<BlockHash, Error> {
        let input = match self {
            Self::Sha256 => pickle::seed(seed.as_str()),
            Self::Sha256Cbor => cbor::seed(seed.as_str())?,
        };
        Ok(Sha256::digest(input).into())
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HashAlgo {
    type Err = Error;

    /// Parses vLLM's names.
    ///
    /// # Errors
    /// [`Error::UnsupportedHashAlgo`] for any other name, `xxhash` and
    /// `xxhash_cbor` included.
    fn from_str(name: &str) -> Result<Self, Error> {
        match name {
            "sha256" => Ok(Self::Sha256),
            "sha256_cbor" => Ok(Self::Sha256Cbor),
            _ => Err(Error::UnsupportedHashAlgo(name.to_owned())),
        }
    }
}

/// The string `NONE_HASH` is derived from (`resolve_none_hash_seed`): the engine's
/// `PYTHONHASHSEED` if set, else `"vllm-none-hash"` for the sha256 family.
///
/// It must be the engines' value, not the router's: every engine process sharing the
/// store must run with the same `PYTHONHASHSEED` (or none), and so must this seed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NoneHashSeed(String);

impl NoneHashSeed {
    /// `DEFAULT_NONE_HASH_SEED`, used when `PYTHONHASHSEED` is not set.
    pub const DEFAULT: &'static str = "vllm-none-hash";

    /// The seed of engines started with `PYTHONHASHSEED` = `pythonhashseed`, or
    /// without it (`None`). Any set value counts, even an empty one, as in vLLM.
    #[must_use]
    pub fn from_pythonhashseed(pythonhashseed: Option<&str>) -> Self {
        Self(pythonhashseed.unwrap_or(Self::DEFAULT).to_owned())
    }

    /// As [`from_pythonhashseed`](Self::from_pythonhashseed) with this process's
    /// `PYTHONHASHSEED`: right when the router runs with the engines' environment.
    ///
    /// # Errors
    /// [`Error::BadSeed`] when `PYTHONHASHSEED` is set but not UTF-8.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var("PYTHONHASHSEED") {
            Ok(value) => Ok(Self(value)),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::BadSeed),
        }
    }

    /// The seed string.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for NoneHashSeed {
    /// `"vllm-none-hash"`.
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

/// Computes the block hashes a vLLM 0.33 engine computes for a request: one 32-byte
/// SHA-256 per full block of `hash_block_size` tokens, each chained over its parent.
///
/// `hash_block_size` is the engine's hash block size: the KV-cache block size (times
/// the decode-context-parallel size when the cache is DCP-sharded) for a model with
/// one KV-cache group, `prefix_match_unit` or the GCD of the groups' block sizes for
/// a hybrid model (`resolve_kv_cache_block_sizes`). A partial last block has no hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockHasher {
    algo: HashAlgo,
    hash_block_size: usize,
    none_hash: BlockHash,
}

impl BlockHasher {
    /// A hasher for engines using `algo`, `NONE_HASH` seed `seed` and blocks of
    /// `hash_block_size` tokens.
    ///
    /// # Errors
    /// [`Error::BadBlockSize`] for `hash_block_size` 0; [`Error::Cbor`] as
    /// [`HashAlgo::none_hash`].
    pub fn new(algo: HashAlgo, seed: &NoneHashSeed, hash_block_size: usize) -> Result<Self, Error> {
        if hash_block_size == 0 {
            return Err(Error::BadBlockSize {
                what: "hash_block_size",
                why: "must be at least 1 token".to_owned(),
            });
        }
        Ok(Self {
            algo,
            hash_block_size,
            none_hash: algo.none_hash(seed)?,
        })
    }

    /// The algorithm.
    #[must_use]
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// Tokens per hashed block.
    #[must_use]
    pub fn hash_block_size(&self) -> usize {
        self.hash_block_size
    }

    /// `NONE_HASH`, the parent of every first block.
    #[must_use]
    pub fn none_hash(&self) -> &BlockHash {
        &self.none_hash
    }

    /// `hash_block_tokens(hash_fn, parent, block_tokens, extra_keys)`: the hash of one
    /// block given its parent's hash (`None` for the first block: `NONE_HASH`). Any
    /// number of tokens is hashed; vLLM only hashes full blocks.
    ///
    /// # Errors
    /// As [`HashAlgo::block_input`].
    pub fn hash_block_tokens(
        &self,
        parent: Option<&BlockHash>,
        block_tokens: &[u32],
        extra_keys: &[ExtraKey],
    ) -> Result<BlockHash, Error> {
        let parent = parent.unwrap_or(&self.none_hash);
        let input = self.algo.block_input(parent, block_tokens, extra_keys)?;
        Ok(Sha256::digest(input).into())
    }

    /// The block hashes of a request whose token ids are `tokens` (prompt, then any
    /// generated tokens), computed in one pass from the first token as the engine
    /// does when the request arrives: `tokens.len() / hash_block_size` hashes.
    ///
    /// # Errors
    /// [`Error::MmFeatures`] or [`Error::PromptEmbeds`] when `extra` does not fit
    /// `tokens`; [`Error::Cbor`] as [`HashAlgo::block_input`].
    pub fn request_block_hashes(
        &self,
        tokens: &[u32],
        extra: &RequestExtraKeys,
    ) -> Result<Vec<BlockHash>, Error> {
        Ok(self.chain(tokens, extra, false)?.0)
    }

    /// The bytes hashed for each block of
    /// [`request_block_hashes`](Self::request_block_hashes), in order: the pickle or
    /// CBOR serialization of `(parent, tuple(block_tokens), extra_keys)`. For checking
    /// against, or diagnosing a difference from, what vLLM hashes.
    ///
    /// # Errors
    /// As [`request_block_hashes`](Self::request_block_hashes).
    pub fn request_block_inputs(
        &self,
        tokens: &[u32],
        extra: &RequestExtraKeys,
    ) -> Result<Vec<Vec<u8>>, Error> {
        Ok(self.chain(tokens, extra, true)?.1)
    }

    /// `request_block_hasher` from the first token: the hashes, and the hashed
    /// inputs when `keep_inputs`.
    fn chain(
        &self,
        tokens: &[u32],
        extra: &RequestExtraKeys,
        keep_inputs: bool,
    ) -> Result<(Vec<BlockHash>, Vec<Vec<u8>>), Error> {
        extra.validate(tokens.len())?;
        let n = self.hash_block_size;
        let mut hashes: Vec<BlockHash> = Vec::with_capacity(tokens.len() / n);
        let mut inputs = Vec::new();
        let mut keys = Vec::new();
        let mut mm_index = 0;
        for (i, block) in tokens.chunks_exact(n).enumerate() {
            keys.clear();
            extra.block_keys(i * n, (i + 1) * n, &mut mm_index, &mut keys);
            let parent = hashes.last().unwrap_or(&self.none_hash);
            let input = self.algo.block_input(parent, block, &keys)?;
            hashes.push(Sha256::digest(&input).into());
            if keep_inputs {
                inputs.push(input);
            }
        }
        Ok((hashes, inputs))
    }

    /// [`request_block_hashes`](Self::request_block_hashes) as the [`BlockHashes`]
    /// that lookup-core's `Request` and the lookup wire carry (`hash_len` 32, or 0
    /// when there is no full block): what a vLLM scheduler sends for this request.
    ///
    /// # Errors
    /// As [`request_block_hashes`](Self::request_block_hashes). ([`Error::BlockHashes`]
    /// cannot occur: 32 divides the data.)
    pub fn block_hashes(
        &self,
        tokens: &[u32],
        extra: &RequestExtraKeys,
    ) -> Result<BlockHashes, Error> {
        let hashes = self.request_block_hashes(tokens, extra)?;
        let data: Vec<u8> = hashes.concat();
        Ok(BlockHashes::new(HASH_LEN as u16, Bytes::from(data))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_as_vllm_spells_them() {
        assert_eq!("sha256".parse::<HashAlgo>().unwrap(), HashAlgo::Sha256);
        assert_eq!(
            "sha256_cbor".parse::<HashAlgo>().unwrap(),
            HashAlgo::Sha256Cbor
        );
        assert_eq!(
            "xxhash".parse::<HashAlgo>().unwrap_err(),
            Error::UnsupportedHashAlgo("xxhash".to_owned())
        );
        assert_eq!(HashAlgo::Sha256Cbor.to_string(), "sha256_cbor");
    }

    #[test]
    fn chain_has_one_hash_per_full_block() {
        let hasher = BlockHasher::new(HashAlgo::Sha256, &NoneHashSeed::default(), 4).unwrap();
        let tokens: Vec<u32> = (0..11).collect();
        let chain = hasher
            .block_hashes(&tokens, &RequestExtraKeys::new())
            .unwrap();
        assert_eq!((chain.len(), chain.hash_len()), (2, 32));
        let first = hasher.hash_block_tokens(None, &tokens[..4], &[]).unwrap();
        let second = hasher
            .hash_block_tokens(Some(&first), &tokens[4..8], &[])
            .unwrap();
        assert_eq!(chain.get(0), Some(&first[..]));
        assert_eq!(chain.get(1), Some(&second[..]));
        let none = hasher
            .block_hashes(&tokens[..3], &RequestExtraKeys::new())
            .unwrap();
        assert_eq!((none.len(), none.hash_len()), (0, 0));
        assert_eq!(
            BlockHasher::new(HashAlgo::Sha256, &NoneHashSeed::default(), 0).unwrap_err(),
            Error::BadBlockSize {
                what: "hash_block_size",
                why: "must be at least 1 token".to_owned()
            }
        );
    }
}
