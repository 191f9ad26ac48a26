//! The README's router example: how many leading blocks of a prompt the store holds,
//! asked of the Mooncake master itself with [`StoreCheck`]. The text between the
//! markers is the README's, verbatim (a test checks it).
//! Run: `cargo run -p lookup-tokio --example router_quick_start -- HOST:PORT`.

// router: begin
use lookup_tokio::vllm_block_hash::{BlockHasher, Deployment, HashAlgo, NoneHashSeed};
use lookup_tokio::vllm_block_hash::{RequestExtraKeys, StoreKeys};
use lookup_tokio::{DirectConfig, StoreCheck, StoredBlocks};

async fn router_check(master: &str) -> Result<Option<StoredBlocks>, Box<dyn std::error::Error>> {
    // The engines' store keys and block hashes: `vllm serve Qwen/Qwen3-8B`, 16-token blocks.
    let engines = Deployment::new("Qwen/Qwen3-8B", 16);
    let layout = lookup_tokio::vllm::key_layout(&StoreKeys::new(&engines)?)?;
    let hasher = BlockHasher::new(HashAlgo::Sha256, &NoneHashSeed::default(), 16)?;
    let tokens: Vec<u32> = (0..50).collect();
    let block_hashes = hasher.block_hashes(&tokens, &RequestExtraKeys::new())?;
    // One handle for every task: store.clone() is an Arc clone, check takes &self.
    let store = StoreCheck::connect_direct(DirectConfig::parse(master, layout)?, 16).await?;
    match store.check(&block_hashes).await {
        Ok(stored) => Ok(Some(stored)), // hit_blocks, and hit_tokens = hit_blocks x 16
        Err(why) => {
            // Down, no leader, timed out, malformed: never read as 0 blocks.
            eprintln!("route without cache information: {why}");
            Ok(None)
        }
    }
}
// router: end

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let master = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:50051".into());
    println!("{:?}", router_check(&master).await?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use lookup_tokio::StoredBlocks;
    use lookup_tokio::vllm_block_hash::{BlockHasher, Deployment, HashAlgo, NoneHashSeed};
    use lookup_tokio::vllm_block_hash::{RequestExtraKeys, StoreKeys};

    /// The README's router check against the real `mooncake_master` (from the pinned
    /// wheel) holding the first 2 of the prompt's 3 blocks, written by Mooncake's own
    /// Python client under the engines' keys: 2 blocks, 32 tokens.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_router_check_reads_what_a_real_master_holds() {
        let master = mooncake_peers::Master::start();
        let mut writer = mooncake_peers::Writer::start(&master);
        let engines = Deployment::new("Qwen/Qwen3-8B", 16);
        let layout = lookup_tokio::vllm::key_layout(&StoreKeys::new(&engines).unwrap()).unwrap();
        let hasher = BlockHasher::new(HashAlgo::Sha256, &NoneHashSeed::default(), 16).unwrap();
        let tokens: Vec<u32> = (0..50).collect();
        let block_hashes = hasher
            .block_hashes(&tokens, &RequestExtraKeys::new())
            .unwrap();
        writer.put(&layout.chain_keys(&block_hashes, 2));
        let stored = super::router_check(&master.addr()).await.unwrap();
        assert_eq!(
            stored,
            Some(StoredBlocks {
                hit_blocks: 2,
                hit_tokens: 32
            })
        );
    }

    /// The README shows this file's router check verbatim, and it is at most 30 lines.
    #[test]
    fn the_readme_shows_this_router_check() {
        let example = include_str!("router_quick_start.rs");
        let begin = example.find("// router: begin\n").unwrap() + 17;
        let end = example.find("// router: end").unwrap();
        let snippet = &example[begin..end];
        assert!(
            snippet.lines().count() <= 30,
            "{} lines",
            snippet.lines().count()
        );
        let readme = include_str!("../../../README.md");
        assert!(
            readme.contains(&format!("```rust\n{snippet}```")),
            "README.md does not show examples/router_quick_start.rs's router check verbatim"
        );
    }
}
