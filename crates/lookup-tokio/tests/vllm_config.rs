//! `VllmSetup::from_kv_transfer_config`: a vLLM 0.33 `--kv-transfer-config` in one
//! call, checked against the keys vLLM's workers write (`StoreKeys::put_keys`,
//! golden-vectored against vLLM 0.33.0's own functions).

use lookup_core::BlockHashes;
use lookup_tokio::Error;
use lookup_tokio::vllm::{VllmEngine, VllmSetup};
use lookup_tokio::vllm_block_hash::{Parallelism, Ranks};
use serde_json::json;

fn engine() -> VllmEngine {
    VllmEngine {
        model: "Qwen/Qwen3-8B".to_owned(),
        block_size: 16,
        parallelism: Parallelism::tp(2),
        dp_rank: 1,
        num_kv_heads: 8,
        hostname: "node-7".to_owned(),
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

#[test]
fn a_key_changing_setting_not_honoured_is_an_error_naming_it() {
    for key in ["store_tp_size", "enable_store_tp_lcm", "prefill_tp_sizes"] {
        let config = json!({ "kv_connector_extra_config": { key: 4 } });
        match VllmSetup::from_kv_transfer_config(&config, &engine(), None) {
            Err(Error::ExtraConfig { key: named, .. }) => assert_eq!(named, key),
            other => panic!("{key}: {other:?}"),
        }
    }
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
