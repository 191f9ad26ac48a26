//! A router's store check: "how many leading blocks of this prompt are in the store?",
//! asked of the Mooncake master itself with [`StoreCheck`], from many tasks at once
//! (the handle is `Clone + Send + Sync`: no `Mutex`, no made-up request). Checks made
//! at the same moment share the master's `BatchExistKey` calls. A failure is an error,
//! never a 0: a router must not read an unavailable store as a cold cache.
//!
//! It starts the real `mooncake_master` from the pinned wheel on 127.0.0.1 and writes
//! blocks with the real Python store client (`scripts/mooncake/install.sh` installs
//! both into `.venv`), as the engines' workers would, for tensor-parallel size 2 (two
//! rank namespaces: a block counts when both ranks hold it).
//!
//! Run: `cargo run -p lookup-tokio --example router_check_blocks` (`cargo test -p
//! lookup-tokio --example router_check_blocks` runs it as a test).

use std::time::Duration;

use lookup_tokio::vllm_block_hash::{Deployment, Parallelism, StoreKeys};
use lookup_tokio::{
    BlockHashes, DirectConfig, KeyLayout, StoreCheck, StoreCheckLimits, StoredBlocks, Unavailable,
};
use mooncake_peers::{Master, Writer};

/// Block size in tokens (vLLM's default).
const BLOCK: u32 = 16;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    // The engines' keys, as vLLM derives them: `vllm serve Qwen/Qwen3-8B
    // --tensor-parallel-size 2` (8 KV heads: one namespace per TP rank), model name
    // "Qwen3-8B" (the last path part of `--model`).
    let engines = Deployment::new("Qwen/Qwen3-8B", BLOCK)
        .with_parallelism(Parallelism::tp(2))
        .with_num_kv_heads(8);
    let layout = lookup_tokio::vllm::key_layout(&StoreKeys::new(&engines)?)?;

    // 32 prompts of 8 blocks; the engines stored `p % 9` blocks of prompt `p`.
    let prompts: Vec<(BlockHashes, usize)> = (0..32u64)
        .map(|p| {
            let hashes: Vec<u64> = (0..8).map(|b| 1_000 + p * 100 + b).collect();
            (BlockHashes::from_u64s(&hashes), (p % 9) as usize)
        })
        .collect();
    for (chain, stored) in &prompts {
        writer.put(&layout.chain_keys(chain, *stored));
    }
    // One rank of prompt 1's 2nd block only: it does not count.
    let partial = layout.chain_keys(&prompts[1].0, 2);
    writer.put(&partial[partial.len() - 1..]);

    // The same settings as a direct LookupClient (`DirectConfig`, block size).
    let store =
        StoreCheck::connect_direct(DirectConfig::parse(&master.addr(), layout)?, BLOCK).await?;
    // Every prompt checked from its own task, all at once.
    let tasks: Vec<_> = prompts
        .iter()
        .map(|(chain, _)| {
            let (store, chain) = (store.clone(), chain.clone());
            tokio::spawn(async move { store.check(&chain).await })
        })
        .collect();
    for (p, (task, (chain, stored))) in tasks.into_iter().zip(&prompts).enumerate() {
        let found = task.await??;
        let want = StoredBlocks {
            hit_blocks: *stored,
            hit_tokens: *stored as u32 * BLOCK,
        };
        if found != want {
            return Err(format!("prompt {p}: {found:?}, expected {want:?}").into());
        }
        if p < 3 {
            println!(
                "prompt {p}: {} of {} blocks in the store ({} hit tokens)",
                found.hit_blocks,
                chain.len(),
                found.hit_tokens
            );
        }
    }
    let batches = store.batch_stats();
    let calls = store.master().stats().batch_exist_calls;
    println!(
        "{} checks in {} batches, {calls} BatchExistKey calls, {} keys asked",
        batches.lookups, batches.batches, batches.keys_asked
    );
    if batches.lookups != 32 || calls >= 32 {
        return Err(format!("32 checks took {calls} calls: not shared").into());
    }

    // With the master gone, a check is an error, never "0 blocks".
    drop(master);
    let limits = StoreCheckLimits::default().with_timeout(Duration::from_secs(2));
    match store.check(&prompts[8].0).await {
        Err(why @ (Unavailable::Transport | Unavailable::TimedOut)) => {
            println!("master down: {why}");
        }
        other => return Err(format!("a down master answered {other:?}").into()),
    }
    // And a store check that cannot connect says why.
    let down = DirectConfig::parse("127.0.0.1:1", KeyLayout::new("Qwen3-8B"))?;
    match StoreCheck::connect_with(down, BLOCK, limits).await {
        Err(error @ lookup_tokio::Error::Unreachable { .. }) => println!("connect: {error}"),
        Err(error) => return Err(error.into()),
        Ok(_) => return Err("connect to a down master succeeded".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_example_runs() {
        super::main().expect("the router example");
    }
}
