//! The keys the client asks for are vLLM's: for every single-hash-per-block case of
//! vLLM 0.33.0's own golden vectors (crates/vllm-block-hash/tests/golden, produced by
//! scripts/vllm/golden-vectors.sh from the released wheel), the [`KeyLayout`] of
//! `lookup_tokio::vllm::key_layout` gives the deployment's lookup keys byte for byte,
//! with 1, 2, 4 and 8 rank namespaces (MLA with TP 4, GQA with TP 8 over 2 KV heads,
//! store-TP layouts, a cache prefix).

use std::collections::BTreeSet;

use lookup_tokio::vllm::key_layout;
use lookup_tokio::vllm_block_hash::{
    AttentionKind, Deployment, KvCacheGroup, KvCacheLayout, Parallelism, StoreKeys, StoreTp,
};
use lookup_tokio::{BlockHashes, KeyLayout};
use serde_json::Value;

const GOLDEN: &str = include_str!("../../vllm-block-hash/tests/golden/vllm-0.33.0.json");

fn u32_of(v: &Value) -> u32 {
    u32::try_from(v.as_u64().expect("a number")).expect("u32")
}

/// The vLLM deployment of a golden key case.
fn deployment(case: &Value) -> Deployment {
    let x = &case["extra_config"];
    let store_tp = if x["enable_store_tp_lcm"] == Value::Bool(true) {
        let sizes: Vec<u32> = x["prefill_tp_sizes"]
            .as_array()
            .map(|a| a.iter().map(u32_of).collect())
            .unwrap_or_default();
        StoreTp::lcm(&sizes)
    } else {
        match &x["store_tp_size"] {
            Value::Null => StoreTp::NotRequested,
            v => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n > 0)
                .map_or(StoreTp::Unresolved, StoreTp::Size),
        }
    };
    let layout = match case["kv_cache_layout"].as_str().unwrap_or("LBHNC") {
        "LBHNC" => KvCacheLayout::Lbhnc,
        "LBNHC" => KvCacheLayout::Lbnhc,
        "BLHNC" => KvCacheLayout::Blhnc,
        other => panic!("layout {other} not in the vectors"),
    };
    let groups: Vec<KvCacheGroup> = case["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| KvCacheGroup {
            kind: match g["kind"].as_str() {
                Some("full") => AttentionKind::Full,
                Some("mla") => AttentionKind::Mla,
                other => panic!("kind {other:?} not in the vectors"),
            },
            block_size: u32_of(&g["block_size"]),
        })
        .collect();
    let p = &case["parallel"];
    Deployment::new(case["model"].as_str().expect("model"), groups[0].block_size)
        .with_cache_prefix(x["cache_prefix"].as_str().unwrap_or_default())
        .with_parallelism(Parallelism::new(
            u32_of(&p["tp"]),
            u32_of(&p["pcp"]),
            u32_of(&p["dcp"]),
            u32_of(&p["pp"]),
        ))
        .with_num_kv_heads(u32_of(&case["num_kv_heads"]))
        .with_groups(groups)
        .with_hash_block_size(u32_of(&case["hash_block_size"]))
        .with_kv_cache_layout(layout)
        .with_store_tp(store_tp)
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

#[test]
fn the_key_layout_asks_for_the_keys_vllm_looks_up() {
    let golden: Value = serde_json::from_str(GOLDEN).expect("the golden vectors parse");
    let mut namespaces_seen = BTreeSet::new();
    let mut checked = Vec::new();
    for case in golden["store_keys"].as_array().expect("store_keys") {
        let name = case["name"].as_str().expect("name");
        let keys = StoreKeys::new(&deployment(case)).expect("deployment");
        let layout: KeyLayout = match key_layout(&keys) {
            Ok(layout) => layout,
            Err(e) => {
                assert_eq!(name, "hash_block_size_chunks_two_groups", "{e}");
                assert_eq!(
                    e.to_string(),
                    "invalid client configuration `hash_block_size`: KV-cache group 1 has \
                     blocks of 32 tokens and the scheduler blocks of 64: groups of different \
                     block sizes are keyed chunk by chunk per group, which a KeyLayout cannot \
                     express"
                );
                continue;
            }
        };
        let hashes: Vec<Vec<u8>> = strings(&case["block_hashes"])
            .iter()
            .map(|h| unhex(h))
            .collect();
        let chain = BlockHashes::from_hashes(&hashes).expect("hashes");
        let block_size = keys.scheduler_block_size();
        let num_tokens = u32_of(&case["num_tokens"]);
        let blocks = ((num_tokens / block_size) as usize).min(chain.len());
        assert_eq!(
            layout.chain_keys(&chain, blocks),
            strings(&case["lookup_keys"]),
            "{name}"
        );
        namespaces_seen.insert(layout.namespaces().len());
        checked.push(name.to_owned());
    }
    assert_eq!(checked.len(), 13, "{checked:?}");
    assert_eq!(
        namespaces_seen,
        BTreeSet::from([1, 2, 4, 8]),
        "1, 4 and 8 namespaces (and 2: GQA over 2 KV heads) covered"
    );
}

/// Blocks of 64 tokens over 16-token hashes: each block is keyed by the last hash of
/// its chunk, as `StoreKeys::lookup_keys` (itself checked against vLLM) asks.
#[test]
fn a_block_of_several_hashes_is_keyed_by_its_last_hash() {
    let keys = StoreKeys::new(
        &Deployment::new("m", 64)
            .with_hash_block_size(16)
            .with_parallelism(Parallelism::new(2, 1, 1, 1)),
    )
    .expect("deployment");
    let layout = key_layout(&keys).expect("layout");
    assert_eq!(layout.hashes_per_block(), 4);
    let hashes: Vec<[u8; 1]> = (0..11u8).map(|i| [i]).collect();
    let chain = BlockHashes::from_hashes(&hashes).expect("hashes");
    // 11 hashes: two whole chunks (hashes 3 and 7); 200 tokens: 3 blocks of 64.
    assert_eq!(layout.blocks_of(chain.len()), 2);
    assert_eq!(
        layout.chain_keys(&chain, 3),
        keys.lookup_keys(200, &chain),
        "the same keys in the same order"
    );
    assert_eq!(
        layout.chain_keys(&chain, 3),
        [
            "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@03",
            "m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@03",
            "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@07",
            "m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@07",
        ]
    );
}

#[test]
fn the_model_is_the_last_path_component_of_model() {
    let keys = StoreKeys::new(&Deployment::new("meta-llama/Llama-3.1-8B-Instruct/", 16))
        .expect("deployment");
    let layout = key_layout(&keys).expect("layout");
    assert_eq!(layout.model(), "Llama-3.1-8B-Instruct");
    assert_eq!(
        layout.block_keys(&[0xab; 2]),
        ["Llama-3.1-8B-Instruct@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@abab"]
    );
}

#[test]
fn mla_at_tp_4_asks_one_namespace_where_the_grid_asks_four() {
    let keys = StoreKeys::new(
        &Deployment::new("deepseek-ai/DeepSeek-V3", 64)
            .with_parallelism(Parallelism::new(4, 1, 1, 1))
            .with_num_kv_heads(1)
            .with_groups(vec![KvCacheGroup {
                kind: AttentionKind::Mla,
                block_size: 64,
            }]),
    )
    .expect("deployment");
    let layout = key_layout(&keys).expect("layout");
    assert_eq!(
        layout.block_keys(&[1]),
        ["DeepSeek-V3@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@01"]
    );
    let grid = KeyLayout::new("DeepSeek-V3")
        .with_namespaces(lookup_tokio::RankNamespace::grid(4, 1))
        .expect("grid");
    assert_eq!(
        grid.namespaces().len(),
        4,
        "tp_rank 1-3 keys are never written"
    );
}

/// End to end through the reference server: blocks of 64 tokens over 16-token
/// hashes, the store holding the first two chunks (keyed by hashes 3 and 7).
#[tokio::test]
async fn a_server_answers_chunked_blocks_by_their_last_hash() {
    use std::sync::Arc;

    use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
    use lookup_tokio::{LookupClient, Probe, Request, RequestId};

    let keys =
        StoreKeys::new(&Deployment::new("m", 64).with_hash_block_size(16)).expect("deployment");
    let layout = key_layout(&keys).expect("layout");
    let hashes: Vec<[u8; 1]> = (0..12u8).map(|i| [i]).collect();
    let chain = BlockHashes::from_hashes(&hashes).expect("hashes");
    let index = Arc::new(InMemoryIndex::new());
    assert_eq!(index.insert_chain(&layout, &chain, 2), 2);
    let server = LookupServer::bind(
        &"tcp://127.0.0.1:0".parse().expect("endpoint"),
        ServerConfig::new(64, layout),
        index,
    )
    .expect("bind");
    let mut client = LookupClient::builder()
        .zmq_endpoint(server.local_endpoint().clone())
        .block_size(64)
        .connect()
        .await
        .expect("connect");
    let req = Request {
        request_id: RequestId(1),
        num_tokens: 200,
        block_hashes: chain,
        skip_reading_external_kv: false,
    };
    assert_eq!(
        client.probe_until(&req, 0, client.step_deadline()).await,
        Probe::Ready {
            external_tokens: 128,
            load_async: true
        }
    );
    client.on_finished(req.request_id);
    client.shutdown().await;
    server.shutdown().await;
}
