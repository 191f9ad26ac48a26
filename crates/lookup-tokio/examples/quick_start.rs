//! The README's quick start: how many tokens of a prompt a vLLM engine's store holds,
//! asked of its lookup endpoint (a vLLM MooncakeStoreConnector worker, or
//! `lookup-server`). The text between the markers is the README's, verbatim (a test
//! checks it). Run: `cargo run -p lookup-tokio --example quick_start -- tcp://HOST:PORT`.

// quick start: begin
use lookup_tokio::{Deadline, LookupClient, Probe, Request, RequestId};
use vllm_block_hash::{BlockHasher, HashAlgo, NoneHashSeed, RequestExtraKeys};

async fn quick_start(endpoint: &str) -> Result<Probe, Box<dyn std::error::Error>> {
    let mut client = LookupClient::builder()
        .zmq(endpoint) // e.g. ipc:///tmp/lookup_rpc_port_0_host_HOST_dp_rank0
        .block_size(16) // the engines' --block-size
        .kv_connector_extra_config(&serde_json::json!({ "lookup_async": false }))
        .connect()
        .await?;
    // The engines' block hashes of the prompt (vLLM's default `sha256`).
    let hasher = BlockHasher::new(HashAlgo::Sha256, &NoneHashSeed::default(), 16)?;
    let tokens: Vec<u32> = (0..50).collect();
    let block_hashes = hasher.block_hashes(&tokens, &RequestExtraKeys::new())?;
    let req = Request::new(RequestId(1), 50, block_hashes);
    client.on_new_request(&req); // prefetches when lookup_async and a prefetch limit are on
    let probe = client.probe_until(&req, 0, Deadline::Answer).await; // waits for the answer
    println!("{probe:?}: {:?}", client.answer_of(req.request_id)); // hit, miss or unavailable
    client.on_allocated(req.request_id);
    client.on_finished(req.request_id);
    client.shutdown().await;
    Ok(probe)
}
// quick start: end

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tcp://127.0.0.1:5555".into());
    let _printed = quick_start(&endpoint).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
    use lookup_tokio::{KeyLayout, Probe};
    use vllm_block_hash::{BlockHasher, HashAlgo, NoneHashSeed, RequestExtraKeys};

    /// The quick start's answer when the store holds the first 2 of its prompt's 3
    /// blocks: 32 tokens (2 blocks of 16).
    const TWO_BLOCKS: Probe = Probe::Ready {
        external_tokens: 32,
        load_async: true,
    };

    /// The quick start's prompt, hashed as it hashes it: 50 tokens, 3 full blocks.
    fn prompt() -> lookup_tokio::BlockHashes {
        let hasher = BlockHasher::new(HashAlgo::Sha256, &NoneHashSeed::default(), 16).unwrap();
        let tokens: Vec<u32> = (0..50).collect();
        let block_hashes = hasher
            .block_hashes(&tokens, &RequestExtraKeys::new())
            .unwrap();
        assert_eq!(block_hashes.len(), 3);
        block_hashes
    }

    /// Against a reference server holding the first 2 of the prompt's 3 blocks.
    #[tokio::test]
    async fn the_quick_start_reads_what_the_store_holds() {
        let block_hashes = prompt();
        let layout = KeyLayout::default();
        let index = Arc::new(InMemoryIndex::new());
        index.insert_chain(&layout, &block_hashes, 2);
        let server = LookupServer::bind(
            &"tcp://127.0.0.1:0".parse().unwrap(),
            ServerConfig::new(16, layout),
            index,
        )
        .unwrap();
        let probe = super::quick_start(&server.local_endpoint().url())
            .await
            .unwrap();
        assert_eq!(probe, TWO_BLOCKS);
        server.shutdown().await;
    }

    /// The README's quick start is this file's, verbatim, and at most 30 lines.
    #[test]
    fn the_readme_shows_this_quick_start() {
        let example = include_str!("quick_start.rs");
        let begin = example.find("// quick start: begin\n").unwrap() + 22;
        let end = example.find("// quick start: end").unwrap();
        let snippet = &example[begin..end];
        assert!(
            snippet.lines().count() <= 30,
            "{} lines",
            snippet.lines().count()
        );
        let readme = include_str!("../../../README.md");
        assert!(
            readme.contains(&format!("```rust\n{snippet}```")),
            "README.md does not show examples/quick_start.rs's quick start verbatim"
        );
    }

    /// The same quick start against `lookup-server`'s Mooncake index in front of the
    /// real `mooncake_master` (started from the pinned wheel), with the first 2 of the
    /// prompt's 3 blocks written by Mooncake's own Python client.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_quick_start_reads_what_a_real_master_holds() {
        use lookup_server::MooncakeIndex;
        use lookup_server::mooncake_master::MasterConfig;

        let block_hashes = prompt();
        let master = mooncake_peers::Master::start();
        let mut writer = mooncake_peers::Writer::start(&master);
        let layout = KeyLayout::new("quick-start");
        writer.put(&layout.chain_keys(&block_hashes, 2));
        let index = MooncakeIndex::connect(&master.addr(), MasterConfig::default())
            .await
            .unwrap();
        let server = LookupServer::bind(
            &"tcp://127.0.0.1:0".parse().unwrap(),
            ServerConfig::new(16, layout),
            Arc::new(index),
        )
        .unwrap();
        let probe = super::quick_start(&server.local_endpoint().url())
            .await
            .unwrap();
        assert_eq!(probe, TWO_BLOCKS);
        server.shutdown().await;
    }
}
