//! `VllmSetup::from_kv_transfer_config`: a vLLM 0.33 `--kv-transfer-config` in one
//! call, checked against the keys vLLM's workers write (`StoreKeys::put_keys`,
//! golden-vectored against vLLM 0.33.0's own functions).

use lookup_core::BlockHashes;
use lookup_tokio::Error;
use lookup_tokio::vllm::{VllmEngine, VllmSetup};
use lookup_tokio::vllm_block_hash::{KvCacheLayout, Parallelism, Ranks};
use serde_json::Value;
use serde_json::json;

fn engine() -> VllmEngine {
    VllmEngine {
        model: "Qwen/Qwen3-8B".to_owned(),
        block_size: 16,
        parallelism: Parallelism::tp(2),
        dp_rank: 1,
        num_kv_heads: 8,
        hostname: "node-7".to_owned(),
        kv_cache_layout: KvCacheLayout::Lbhnc,
        use_mla: false,
    }
}

#[test]
fn a_vllm_kv_transfer_config_with_cache_prefix_and_tp_2_asks_the_workers_keys() {
    // As given to `vllm serve --kv-transfer-config`.
    let config = json!({
        "kv_connector": "MooncakeStoreConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cache_prefix": "tenant-a",
            "lookup_rpc_port": 3,
            "lookup_async": true,
            "enable_cross_layers_blocks": false,
            "mooncake_protocol": "tcp"
        }
    });
    let setup = VllmSetup::from_kv_transfer_config(
        &config,
        &engine(),
        Some(std::path::Path::new("/run/vllm")),
    )
    .unwrap();
    assert_eq!(
        setup.endpoint.url(),
        "ipc:///run/vllm/lookup_rpc_port_3_host_node-7_dp_rank1"
    );
    assert_eq!(setup.config.block_size, 16);
    assert!(setup.config.lookup_async);
    let zmq = setup.zmq_client_config();
    assert_eq!(zmq.transport.target(), setup.endpoint.url());
    assert_eq!(zmq.core, setup.config);
    let mut direct = setup.direct_client_config("127.0.0.1:50051".parse().unwrap());
    assert_eq!(direct.core, setup.config);
    let direct = direct.transport.direct_mut().expect("direct");
    assert_eq!(
        (direct.master.to_string(), &direct.layout),
        ("127.0.0.1:50051".to_owned(), &setup.key_layout)
    );

    let hashes = BlockHashes::from_u64s(&[11, 12, 13]);
    let asked = setup.key_layout.chain_keys(&hashes, 3);
    // What the two TP workers write, block-major like the lookup's keys.
    let rank0 = setup
        .store_keys
        .put_keys(Ranks::new(0, 0, 0, 0), 48, &hashes)
        .unwrap();
    let rank1 = setup
        .store_keys
        .put_keys(Ranks::new(1, 0, 0, 0), 48, &hashes)
        .unwrap();
    let written: Vec<String> = rank0
        .iter()
        .zip(&rank1)
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    assert_eq!(asked, written);
    assert_eq!(
        asked[..2],
        [
            "tenant-a@Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@000000000000000b",
            "tenant-a@Qwen3-8B@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@000000000000000b",
        ]
    );
}

const GOLDEN: &str = include_str!("../../vllm-block-hash/tests/golden/vllm-0.33.0.json");

fn u32_of(v: &Value) -> u32 {
    u32::try_from(v.as_u64().expect("a number")).expect("u32")
}

/// Every key that changes the store keys takes effect: each golden case of vLLM
/// 0.33.0's own key functions with one KV-cache group (store TP shared, by LCM,
/// MQA-replicated and unsupported; cache prefix; TP, PP, PCP, DCP; MLA), given as
/// its `kv_connector_extra_config` inside a `--kv-transfer-config`, asks exactly the
/// keys vLLM looks up.
#[test]
fn every_store_key_setting_of_vllms_golden_cases_takes_effect() {
    let golden: Value = serde_json::from_str(GOLDEN).expect("the golden vectors parse");
    let mut checked = Vec::new();
    for case in golden["store_keys"].as_array().expect("store_keys") {
        let name = case["name"].as_str().expect("name");
        let groups = case["groups"].as_array().expect("groups");
        if groups.len() != 1 {
            continue;
        }
        let p = &case["parallel"];
        let engine = VllmEngine {
            model: case["model"].as_str().expect("model").to_owned(),
            block_size: u32_of(&groups[0]["block_size"]),
            parallelism: Parallelism::new(
                u32_of(&p["tp"]),
                u32_of(&p["pcp"]),
                u32_of(&p["dcp"]),
                u32_of(&p["pp"]),
            ),
            dp_rank: 0,
            num_kv_heads: u32_of(&case["num_kv_heads"]),
            hostname: "h".to_owned(),
            kv_cache_layout: match case["kv_cache_layout"].as_str().unwrap_or("LBHNC") {
                "LBHNC" => KvCacheLayout::Lbhnc,
                "LBNHC" => KvCacheLayout::Lbnhc,
                "BLHNC" => KvCacheLayout::Blhnc,
                other => panic!("layout {other} not in the vectors"),
            },
            use_mla: groups[0]["kind"] == "mla",
        };
        let extra = match &case["extra_config"] {
            Value::Null => json!({}),
            x => x.clone(),
        };
        let config = json!({
            "kv_connector": "MooncakeStoreConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        });
        let setup = VllmSetup::from_kv_transfer_config(&config, &engine, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let hashes: Vec<Vec<u8>> = case["block_hashes"]
            .as_array()
            .expect("hashes")
            .iter()
            .map(|h| {
                let h = h.as_str().expect("hex");
                (0..h.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
                    .collect()
            })
            .collect();
        let chain = BlockHashes::from_hashes(&hashes).expect("hashes");
        let blocks =
            ((u32_of(&case["num_tokens"]) / setup.config.block_size) as usize).min(chain.len());
        let expected: Vec<String> = case["lookup_keys"]
            .as_array()
            .expect("lookup_keys")
            .iter()
            .map(|k| k.as_str().expect("key").to_owned())
            .collect();
        assert_eq!(
            setup.key_layout.chain_keys(&chain, blocks),
            expected,
            "{name}"
        );
        checked.push(name.to_owned());
    }
    assert_eq!(
        checked,
        [
            "one_namespace",
            "four_namespaces_tp4_cache_prefix",
            "four_namespaces_tp2_pp2",
            "eight_namespaces_tp4_pp2",
            "eight_namespaces_pcp2_tp2_pp2",
            "eight_namespaces_tp4_dcp2_pp2",
            "eight_namespaces_tp8",
            "gqa_replicated_tp8_kv2",
            "mla_tp4_one_namespace",
            "store_tp_shared_lbhnc",
            "store_tp_lcm_lbnhc_pp2",
            "store_tp_mqa",
            "store_tp_unsupported_rank_local_compat",
        ]
    );
}

#[test]
fn a_setting_of_the_wrong_type_or_an_unknown_key_is_an_error_naming_it() {
    let config = json!({ "kv_connector_extra_config": { "cache_prefix": 7 } });
    match VllmSetup::from_kv_transfer_config(&config, &engine(), None) {
        Err(Error::ExtraConfig { key, why }) => {
            assert_eq!(
                (key.as_str(), why.as_str()),
                ("cache_prefix", "expected a string, got 7")
            );
        }
        other => panic!("{other:?}"),
    }
    let typo = json!({ "kv_connector_extra_config": { "lookup_asnyc": true } });
    assert!(matches!(
        VllmSetup::from_kv_transfer_config(&typo, &engine(), None),
        Err(Error::ExtraConfig { key, .. }) if key == "lookup_asnyc"
    ));
}
