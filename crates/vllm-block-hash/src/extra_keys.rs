//! Extra keys of a block hash: what besides the tokens makes two blocks differ (LoRA
//! adapter, multi-modal items, cache salt, prompt embeddings), as vLLM 0.33's
//! `generate_block_hash_extra_keys` (vllm/v1/core/kv_cache_utils.py) builds them.

use sha2::{Digest, Sha256};

use crate::{BlockHash, Error};

/// One entry of a block's `extra_keys` tuple, in vLLM 0.33's tagged form.
///
/// The Python value each one stands for is given per variant; the block hash covers
/// `extra_keys = tuple(entries)`, or `None` when a block has none.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExtraKey {
    /// `("lora", lora_name, lora_path)` (`_gen_lora_extra_hash_keys`): on every block
    /// of a LoRA request.
    Lora {
        /// `LoRARequest.lora_name`.
        name: String,
        /// `LoRARequest.lora_path`: a name re-pointed at another adapter gets new
        /// hashes.
        path: String,
    },
    /// `("mm", identifier, offset)` (`_gen_mm_extra_hash_keys`): a multi-modal item
    /// that overlaps the block.
    Mm {
        /// `MultiModalFeatureSpec.identifier` as the engine holds it (its `mm_hash`,
        /// prefixed with the LoRA name when the processor does so).
        identifier: String,
        /// The item's first token minus the block's first token, in tokens; negative
        /// when the item began in an earlier block.
        offset: i64,
    },
    /// `("cache_salt", salt)`: on the first block only, when the salt is not empty.
    CacheSalt(String),
    /// `("prompt_embeds", digest)` (`_gen_prompt_embeds_extra_hash_keys`): SHA-256 of
    /// the raw bytes of the block's rows of the prompt-embeddings tensor.
    PromptEmbeds(BlockHash),
}

impl ExtraKey {
    /// Bytes of text or digest this key carries (a capacity hint for encoders).
    pub(crate) fn payload_len(&self) -> usize {
        match self {
            Self::Lora { name, path } => name.len() + path.len() + 16,
            Self::Mm { identifier, .. } => identifier.len() + 16,
            Self::CacheSalt(salt) => salt.len() + 16,
            Self::PromptEmbeds(_) => 48,
        }
    }
}

/// A multi-modal item's placeholder tokens in the prompt (`MultiModalFeatureSpec`'s
/// `identifier` and `mm_position`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmFeature {
    /// The engine's identifier of the item (see [`ExtraKey::Mm`]).
    pub identifier: String,
    /// Index of the item's first placeholder token in the prompt.
    pub offset: usize,
    /// Number of placeholder tokens.
    pub length: usize,
}

/// What of a request other than its token ids goes into its block hashes.
///
/// Build with [`RequestExtraKeys::new`] and the `with_*` methods. The default (no
/// LoRA, no salt, text only) gives every block `extra_keys = None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestExtraKeys {
    lora: Option<(String, String)>,
    cache_salt: Option<String>,
    mm_features: Vec<MmFeature>,
    prompt_embeds: Option<(Vec<u8>, usize)>,
}

impl RequestExtraKeys {
    /// No extra keys: a plain text request.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The request's LoRA adapter (`LoRARequest.lora_name`, `.lora_path`).
    #[must_use]
    pub fn with_lora(mut self, name: impl Into<String>, path: impl Into<String>) -> Self {
        self.lora = Some((name.into(), path.into()));
        self
    }

    /// The request's `cache_salt`; an empty salt is no salt (vLLM tests its truth).
    #[must_use]
    pub fn with_cache_salt(mut self, salt: impl Into<String>) -> Self {
        let salt = salt.into();
        self.cache_salt = (!salt.is_empty()).then_some(salt);
        self
    }

    /// Adds a multi-modal item. Items must be added in prompt order and must not
    /// overlap (vLLM assumes both); [`BlockHasher::request_block_hashes`] checks it.
    ///
    /// [`BlockHasher::request_block_hashes`]: crate::BlockHasher::request_block_hashes
    #[must_use]
    pub fn with_mm_feature(mut self, feature: MmFeature) -> Self {
        self.mm_features.push(feature);
        self
    }

    /// The prompt-embeddings tensor as raw bytes, row-major, `bytes_per_token` bytes a
    /// token (hidden size × element size, in the dtype the engine holds): exactly
    /// what vLLM's `tensor_data` hashes per block.
    #[must_use]
    pub fn with_prompt_embeds(mut self, raw: Vec<u8>, bytes_per_token: usize) -> Self {
        self.prompt_embeds = Some((raw, bytes_per_token));
        self
    }

    /// Checks what vLLM assumes of its inputs, for a request of `num_tokens` tokens.
    ///
    /// # Errors
    /// [`Error::MmFeatures`] for items out of order or overlapping;
    /// [`Error::PromptEmbeds`] when the tensor is not `num_tokens` rows of a non-zero
    /// size.
    pub(crate) fn validate(&self, num_tokens: usize) -> Result<(), Error> {
        for (index, pair) in self.mm_features.windows(2).enumerate() {
            if pair[1].offset < pair[0].offset + pair[0].length {
                return Err(Error::MmFeatures { index: index + 1 });
            }
        }
        if let Some((raw, bytes_per_token)) = &self.prompt_embeds
            && (*bytes_per_token == 0 || raw.len() != num_tokens * bytes_per_token)
        {
            return Err(Error::PromptEmbeds {
                bytes: raw.len(),
                bytes_per_token: *bytes_per_token,
                num_tokens,
            });
        }
        Ok(())
    }

    /// Appends the extra keys of the block of tokens `start..end` to `out`, in vLLM's
    /// order (LoRA, multi-modal, cache salt, prompt embeddings), and moves the
    /// multi-modal cursor `mm_index` as `generate_block_hash_extra_keys` does.
    pub(crate) fn block_keys(
        &self,
        start: usize,
        end: usize,
        mm_index: &mut usize,
        out: &mut Vec<ExtraKey>,
    ) {
        if let Some((name, path)) = &self.lora {
            out.push(ExtraKey::Lora {
                name: name.clone(),
                path: path.clone(),
            });
        }
        self.mm_keys(start, end, mm_index, out);
        if start == 0
            && let Some(salt) = &self.cache_salt
        {
            out.push(ExtraKey::CacheSalt(salt.clone()));
        }
        if let Some((raw, bytes_per_token)) = &self.prompt_embeds {
            let rows = &raw[start * bytes_per_token..end * bytes_per_token];
            out.push(ExtraKey::PromptEmbeds(Sha256::digest(rows).into()));
        }
    }

    /// `_gen_mm_extra_hash_keys`, line for line: the cursor skips items that ended
    /// before the block, takes those that overlap it, and stops at the first item
    /// that goes on past the block or starts after it.
    fn mm_keys(&self, start: usize, end: usize, mm_index: &mut usize, out: &mut Vec<ExtraKey>) {
        let features = &self.mm_features;
        let Some(last) = features.last() else {
            return;
        };
        if last.offset + last.length <= start {
            return;
        }
        let mut index = *mm_index;
        while let Some(f) = features.get(index) {
            if end <= f.offset {
                break;
            }
            if start >= f.offset + f.length {
                index += 1;
                continue;
            }
            out.push(ExtraKey::Mm {
                identifier: f.identifier.clone(),
                offset: signed(f.offset) - signed(start),
            });
            if end >= f.offset + f.length {
                index += 1;
            } else {
                break;
            }
        }
        *mm_index = index;
    }
}

/// A token position as a signed offset; positions beyond `i64::MAX` cannot occur in
/// a request held in memory.
fn signed(position: usize) -> i64 {
    i64::try_from(position).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mm(identifier: &str, offset: usize, length: usize) -> MmFeature {
        MmFeature {
            identifier: identifier.to_owned(),
            offset,
            length,
        }
    }

    fn keys(extra: &RequestExtraKeys, block: usize, blocks: usize) -> Vec<Vec<ExtraKey>> {
        let mut cursor = 0;
        (0..blocks)
            .map(|i| {
                let mut out = Vec::new();
                extra.block_keys(i * block, (i + 1) * block, &mut cursor, &mut out);
                out
            })
            .collect()
    }

    #[test]
    fn multi_modal_items_follow_the_cursor() {
        let extra = RequestExtraKeys::new()
            .with_mm_feature(mm("a", 3, 4))
            .with_mm_feature(mm("b", 9, 20))
            .with_mm_feature(mm("c", 40, 2));
        let m = |id: &str, offset| ExtraKey::Mm {
            identifier: id.to_owned(),
            offset,
        };
        assert_eq!(
            keys(&extra, 16, 4),
            [
                vec![m("a", 3), m("b", 9)],
                vec![m("b", -7)],
                vec![m("c", 8)],
                vec![]
            ]
        );
    }

    #[test]
    fn salt_only_on_the_first_block_and_lora_on_all() {
        let extra = RequestExtraKeys::new()
            .with_cache_salt("s1")
            .with_lora("n", "/p");
        let lora = ExtraKey::Lora {
            name: "n".to_owned(),
            path: "/p".to_owned(),
        };
        assert_eq!(
            keys(&extra, 4, 2),
            [
                vec![lora.clone(), ExtraKey::CacheSalt("s1".to_owned())],
                vec![lora]
            ]
        );
        assert_eq!(
            RequestExtraKeys::new().with_cache_salt(""),
            RequestExtraKeys::new()
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        let overlapping = RequestExtraKeys::new()
            .with_mm_feature(mm("a", 0, 10))
            .with_mm_feature(mm("b", 5, 2));
        assert_eq!(
            overlapping.validate(16).unwrap_err(),
            Error::MmFeatures { index: 1 }
        );
        let short = RequestExtraKeys::new().with_prompt_embeds(vec![0; 7], 4);
        assert_eq!(
            short.validate(2).unwrap_err(),
            Error::PromptEmbeds {
                bytes: 7,
                bytes_per_token: 4,
                num_tokens: 2
            }
        );
    }
}
