//! `lookup hash`: token ids to the block-hash file `probe` and `doctor` read
//! (`--hashes-file`: one lowercase hex hash a line), computed as vLLM 0.33's engine
//! does (`hash_block_tokens` in vllm/v1/core/kv_cache_utils.py, through the
//! `vllm-block-hash` crate, checked against vLLM's own golden vectors).

use std::path::PathBuf;

use clap::Args;
use vllm_block_hash::{BlockHasher, HashAlgo, NoneHashSeed, RequestExtraKeys};

use crate::Failure;

/// Turn a prompt's token ids into its block hashes, one hex hash a line. One of
/// `--tokens` and `--tokens-file` is required (clap refuses neither, exit 2).
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["tokens", "tokens_file"])))]
pub(crate) struct HashArgs {
    /// Token ids, comma-separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "tokens_file")]
    tokens: Vec<u32>,
    /// A file of token ids, separated by commas, spaces or newlines (a JSON array of
    /// integers reads as such: its brackets are skipped).
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// The engines' block size in tokens (their hash block size: one hash per full
    /// block; a trailing partial block has none).
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// vLLM's `--prefix-caching-hash-algo`: `sha256` (the default) or `sha256_cbor`.
    #[arg(long, default_value = "sha256")]
    hash_algo: HashAlgo,
    /// The engines' PYTHONHASHSEED, which seeds the first block's parent hash
    /// (`NONE_HASH`); default: unset, as on the engines when they do not set it.
    #[arg(long, value_name = "SEED")]
    pythonhashseed: Option<String>,
    /// The requests' `cache_salt`, which enters the first block's hash.
    #[arg(long)]
    cache_salt: Option<String>,
    /// Write the hashes to this file instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Prints (or writes to `--out`) the block hashes of the tokens.
pub(crate) fn run(args: &HashArgs) -> Result<(), Failure> {
    let tokens = match &args.tokens_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
            parse_tokens(&text)?
        }
        None => args.tokens.clone(),
    };
    if args.block_size == 0 {
        return Err(Failure::usage("--block-size must be at least 1"));
    }
    let seed = NoneHashSeed::from_pythonhashseed(args.pythonhashseed.as_deref());
    let hasher = BlockHasher::new(args.hash_algo, &seed, args.block_size as usize)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let mut extra = RequestExtraKeys::new();
    if let Some(salt) = &args.cache_salt {
        extra = extra.with_cache_salt(salt.clone());
    }
    let hashes = hasher
        .request_block_hashes(&tokens, &extra)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let mut text = String::with_capacity(hashes.len() * 65);
    for hash in &hashes {
        for byte in hash {
            text.push_str(&format!("{byte:02x}"));
        }
        text.push('\n');
    }
    match &args.out {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| Failure::usage(format!("cannot write {}: {e}", path.display()))),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Token ids separated by commas or whitespace; `[` and `]` are skipped.
fn parse_tokens(text: &str) -> Result<Vec<u32>, Failure> {
    text.split(|c: char| c == ',' || c == '[' || c == ']' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .enumerate()
        .map(|(i, t)| {
            t.parse::<u32>().map_err(|_| {
                Failure::usage(format!("token {i} `{t}` is not a token id (0 to 2^32-1)"))
            })
        })
        .collect()
}
