//! A router-side query over the direct transport: "how many leading blocks of this
//! request are in the store?", asked of the Mooncake master itself, in the shape of
//! Dynamo's shared-cache check (`check_blocks(block_hashes) -> hits`). A failure is
//! an error, never a 0: a router must not read an unavailable store as a cold cache.
//!
//! It starts the real `mooncake_master` from the pinned wheel on 127.0.0.1 and writes
//! blocks with the real Python store client (`scripts/mooncake/install.sh` installs
//! both into `.venv`), as the engines' workers would, for tensor-parallel size 2 (two
//! rank namespaces: a block counts when both ranks hold it).
//!
//! Run: `cargo run -p lookup-tokio --example router_check_blocks` (`cargo test -p
//! lookup-tokio --example router_check_blocks` runs it as a test).

use lookup_tests::mooncake::{Master, Writer};
use lookup_tokio::vllm_block_hash::{Deployment, Parallelism, StoreKeys};
use lookup_tokio::{Answer, BlockHashes, KeyLayout, LookupClient, Request, RequestId, Unavailable};

/// Block size in tokens (vLLM's default).
const BLOCK: u32 = 16;

/// Why a check has no answer.
#[derive(Debug)]
enum CheckError {
    /// The store could not be asked or did not answer usably.
    Unavailable(Unavailable),
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable(why) => write!(f, "the store is unavailable: {why:?}"),
        }
    }
}

impl std::error::Error for CheckError {}

/// The router's check: how many leading blocks of `block_hashes` the store holds in
/// every rank namespace. `request_id` is any id not in use on this client.
async fn check_blocks(
    client: &mut LookupClient,
    request_id: RequestId,
    block_hashes: &BlockHashes,
) -> Result<u32, CheckError> {
    let blocks = u32::try_from(block_hashes.len()).unwrap_or(u32::MAX);
    let req = Request {
        request_id,
        // One token past the last block, so that a full hit counts every block
        // (the last prompt token is always computed, `spec/behaviour.md` rule 12).
        num_tokens: blocks.saturating_mul(BLOCK).saturating_add(1),
        block_hashes: block_hashes.clone(),
        skip_reading_external_kv: false,
    };
    // Sync mode: the probe waits for the master's answer (bounded by the timeout);
    // what the answer rests on (a hit, a miss, an unavailable store) is `answer_of`.
    let _external_tokens = client.probe_step(&req, 0).await;
    let answer = client.answer_of(request_id);
    client.on_finished(request_id);
    match answer {
        Some(Answer::Hit { hit_tokens }) => Ok(hit_tokens / BLOCK),
        Some(Answer::Miss | Answer::NotNeeded) | None => Ok(0),
        Some(Answer::Unavailable(why)) => Err(CheckError::Unavailable(why)),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    // The engines' keys, as vLLM derives them: `vllm serve Qwen/Qwen3-8B
    // --tensor-parallel-size 2` (8 KV heads: one namespace per TP rank), model name
    // "Qwen3-8B" (the last path part of `--model`).
    let engines = Deployment::new("Qwen/Qwen3-8B", BLOCK)
        .with_parallelism(Parallelism::new(2, 1, 1, 1))
        .with_num_kv_heads(8);
    let layout = lookup_tokio::vllm::key_layout(&StoreKeys::new(&engines)?)?;

    // Three prompts of 8 blocks; the engines stored 8, 3 and 0 of their blocks.
    let chains: Vec<BlockHashes> = (1..=3u64)
        .map(|p| BlockHashes::from_u64s(&(0..8).map(|b| p * 100 + b).collect::<Vec<_>>()))
        .collect();
    let stored = [8usize, 3, 0];
    for (chain, &n) in chains.iter().zip(&stored) {
        writer.put(&layout.chain_keys(chain, n));
    }
    // One rank of the second prompt's 4th block only: it does not count.
    let partial = layout.chain_keys(&chains[1], 4);
    writer.put(&partial[partial.len() - 1..]);

    let mut client = LookupClient::builder()
        .direct(&master.addr(), layout)
        .block_size(BLOCK)
        .connect()
        .await?;
    for (i, (chain, &n)) in chains.iter().zip(&stored).enumerate() {
        let hits = check_blocks(&mut client, RequestId(i as u64 + 1), chain).await?;
        println!(
            "prompt {}: {hits} of {} blocks in the store",
            i + 1,
            chain.len()
        );
        if hits as usize != n {
            return Err(format!("prompt {}: {hits} blocks, expected {n}", i + 1).into());
        }
    }
    let stats = client.stats();
    client.shutdown().await;
    let master_stats = stats.master.ok_or("no master counters")?;
    println!(
        "{} BatchExistKey calls, {} keys asked",
        master_stats.batch_exist_calls, master_stats.keys_asked
    );

    // With the master gone, the strict connect fails with the reason, and a lazy
    // client's check is an error, not "0 blocks".
    drop(master);
    let down = || {
        LookupClient::builder()
            .direct("127.0.0.1:1", KeyLayout::new("Qwen3-8B"))
            .block_size(BLOCK)
    };
    match down().connect().await {
        Err(error @ lookup_tokio::Error::Unreachable { .. }) => println!("connect: {error}"),
        Err(error) => return Err(error.into()),
        Ok(_) => return Err("connect to a down master succeeded".into()),
    }
    let mut client = down().connect_lazy()?;
    match check_blocks(&mut client, RequestId(9), &chains[0]).await {
        Err(CheckError::Unavailable(why)) => println!("master down: unavailable ({why:?})"),
        Ok(hits) => return Err(format!("a down master answered {hits} blocks").into()),
    }
    client.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_example_runs() {
        super::main().expect("the router example");
    }
}
