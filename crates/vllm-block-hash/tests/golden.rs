//! Byte-for-byte checks against vLLM 0.33.0's own functions: `tests/golden/vllm-0.33.0.json`
//! was produced by `scripts/vllm/golden-vectors.sh`, which runs the block-hash and
//! store-key code extracted from the released wheel. This test only reads the file.

use std::collections::BTreeSet;

use serde::Deserialize;
use vllm_block_hash::{
    AttentionKind, BlockHasher, Deployment, HashAlgo, KvCacheGroup, KvCacheLayout, MmFeature,
    NoneHashSeed, Parallelism, Ranks, RequestExtraKeys, StoreKeys, StoreTp, model_name,
};

const GOLDEN: &str = include_str!("golden/vllm-0.33.0.json");

#[derive(Deserialize)]
struct Golden {
    block_hashes: Vec<HashCase>,
    model_names: Vec<ModelName>,
    store_keys: Vec<KeyCase>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Tokens {
    List(Vec<u32>),
    /// `(start + i * step) % mod` for `i` in `0..count`.
    Formula {
        start: u64,
        step: u64,
        count: u64,
        #[serde(rename = "mod")]
        modulus: u64,
    },
}

impl Tokens {
    fn expand(&self) -> Vec<u32> {
        match self {
            Self::List(v) => v.clone(),
            Self::Formula {
                start,
                step,
                count,
                modulus,
            } => (0..*count)
                .map(|i| u32::try_from((start + i * step) % modulus).unwrap())
                .collect(),
        }
    }
}

#[derive(Deserialize, Default)]
struct Extra {
    lora: Option<Lora>,
    cache_salt: Option<String>,
    cache_salt_repeat: Option<String>,
    cache_salt_len: Option<usize>,
    #[serde(default)]
    mm_features: Vec<Mm>,
    prompt_embeds: Option<Embeds>,
}

#[derive(Deserialize)]
struct Lora {
    name: String,
    path: String,
}

#[derive(Deserialize)]
struct Mm {
    identifier: String,
    offset: usize,
    length: usize,
}

#[derive(Deserialize)]
struct Embeds {
    bytes_per_token: usize,
    hex: String,
}

#[derive(Deserialize)]
struct HashCase {
    name: String,
    algo: String,
    pythonhashseed: Option<String>,
    none_hash: String,
    hash_block_size: usize,
    tokens: Tokens,
    #[serde(default)]
    extra: Extra,
    block_hashes: Vec<String>,
    inputs: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct ModelName {
    model: String,
    model_name: String,
}

#[derive(Deserialize)]
struct Sizes {
    tp: u32,
    pcp: u32,
    dcp: u32,
    pp: u32,
}

#[derive(Deserialize)]
struct Group {
    kind: String,
    block_size: u32,
}

#[derive(Deserialize, Default)]
struct ExtraConfig {
    cache_prefix: Option<String>,
    store_tp_size: Option<serde_json::Value>,
    enable_store_tp_lcm: Option<bool>,
    prefill_tp_sizes: Option<Vec<u32>>,
}

#[derive(Deserialize)]
struct KeyCase {
    name: String,
    model: String,
    #[serde(default)]
    extra_config: ExtraConfig,
    kv_cache_layout: Option<String>,
    parallel: Sizes,
    rank: Sizes,
    num_kv_heads: u32,
    groups: Vec<Group>,
    hash_block_size: u32,
    num_tokens: u32,
    put_tokens: u32,
    model_name: String,
    store_namespace: String,
    block_hashes: Vec<String>,
    lookup_key_prefixes: Vec<Vec<String>>,
    lookup_keys: Vec<String>,
    put_keys: Vec<String>,
    mooncake_group_ids: Vec<String>,
}

fn golden() -> Golden {
    serde_json::from_str(GOLDEN).expect("tests/golden/vllm-0.33.0.json parses")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn extra_keys(extra: &Extra) -> RequestExtraKeys {
    let mut out = RequestExtraKeys::new();
    if let Some(lora) = &extra.lora {
        out = out.with_lora(lora.name.clone(), lora.path.clone());
    }
    if let Some(salt) = &extra.cache_salt {
        out = out.with_cache_salt(salt.clone());
    }
    if let (Some(repeat), Some(len)) = (&extra.cache_salt_repeat, extra.cache_salt_len) {
        out = out.with_cache_salt(repeat.chars().cycle().take(len).collect::<String>());
    }
    for f in &extra.mm_features {
        out = out.with_mm_feature(MmFeature {
            identifier: f.identifier.clone(),
            offset: f.offset,
            length: f.length,
        });
    }
    if let Some(e) = &extra.prompt_embeds {
        out = out.with_prompt_embeds(unhex(&e.hex), e.bytes_per_token);
    }
    out
}

#[test]
fn block_hashes_and_hashed_bytes_match_vllm() {
    let golden = golden();
    let mut checked = BTreeSet::new();
    let mut blocks = 0;
    let mut inputs_checked = 0;
    for case in &golden.block_hashes {
        let what = format!(
            "{} {} PYTHONHASHSEED={:?}",
            case.name, case.algo, case.pythonhashseed
        );
        let algo: HashAlgo = case.algo.parse().unwrap();
        let seed = NoneHashSeed::from_pythonhashseed(case.pythonhashseed.as_deref());
        let hasher = BlockHasher::new(algo, &seed, case.hash_block_size).unwrap();
        assert_eq!(
            hex(hasher.none_hash()),
            case.none_hash,
            "NONE_HASH of {what}"
        );
        let tokens = case.tokens.expand();
        let extra = extra_keys(&case.extra);
        if let Some(expected) = &case.inputs {
            let inputs: Vec<String> = hasher
                .request_block_inputs(&tokens, &extra)
                .unwrap()
                .iter()
                .map(|b| hex(b))
                .collect();
            assert_eq!(&inputs, expected, "hashed bytes of {what}");
            inputs_checked += inputs.len();
        }
        let hashes: Vec<String> = hasher
            .request_block_hashes(&tokens, &extra)
            .unwrap()
            .iter()
            .map(|h| hex(h))
            .collect();
        assert_eq!(hashes, case.block_hashes, "block hashes of {what}");
        let chain = hasher.block_hashes(&tokens, &extra).unwrap();
        assert_eq!(chain.len(), case.block_hashes.len(), "{what}");
        blocks += hashes.len();
        checked.insert((
            case.algo.clone(),
            case.pythonhashseed.clone(),
            case.name.clone(),
        ));
    }
    // 15 token lists x 2 algorithms x 3 seeds (unset, "0", "vllm-router").
    assert_eq!(checked.len(), 90);
    assert_eq!((blocks, inputs_checked), (192, 168));
}

#[test]
fn none_hash_seeds_differ_as_in_vllm() {
    let golden = golden();
    let none = |algo: &str, seed: Option<&str>| {
        golden
            .block_hashes
            .iter()
            .find(|c| c.algo == algo && c.pythonhashseed.as_deref() == seed)
            .map(|c| c.none_hash.clone())
            .unwrap()
    };
    let all: BTreeSet<String> = ["sha256", "sha256_cbor"]
        .iter()
        .flat_map(|a| [None, Some("0"), Some("vllm-router")].map(|s| none(a, s)))
        .collect();
    assert_eq!(
        all.len(),
        6,
        "each algorithm and seed gives its own NONE_HASH"
    );
}

#[test]
fn model_names_match_vllm() {
    let golden = golden();
    assert_eq!(golden.model_names.len(), 8);
    for m in &golden.model_names {
        assert_eq!(model_name(&m.model), m.model_name, "model {:?}", m.model);
    }
}

fn deployment(case: &KeyCase) -> Deployment {
    let layout = match case.kv_cache_layout.as_deref().unwrap_or("LBHNC") {
        "LBHNC" => KvCacheLayout::Lbhnc,
        "LBNHC" => KvCacheLayout::Lbnhc,
        "BLHNC" => KvCacheLayout::Blhnc,
        other => panic!("layout {other} not in the vectors"),
    };
    let x = &case.extra_config;
    let store_tp = if x.enable_store_tp_lcm == Some(true) {
        StoreTp::lcm(x.prefill_tp_sizes.as_deref().unwrap_or(&[]))
    } else {
        match &x.store_tp_size {
            None => StoreTp::NotRequested,
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n > 0)
                .map_or(StoreTp::Unresolved, StoreTp::Size),
        }
    };
    let groups = case
        .groups
        .iter()
        .map(|g| KvCacheGroup {
            kind: match g.kind.as_str() {
                "full" => AttentionKind::Full,
                "mla" => AttentionKind::Mla,
                other => panic!("kind {other} not in the vectors"),
            },
            block_size: g.block_size,
        })
        .collect();
    let p = &case.parallel;
    Deployment::new(case.model.clone(), case.groups[0].block_size)
        .with_cache_prefix(x.cache_prefix.clone().unwrap_or_default())
        .with_parallelism(Parallelism::new(p.tp, p.pcp, p.dcp, p.pp))
        .with_num_kv_heads(case.num_kv_heads)
        .with_groups(groups)
        .with_hash_block_size(case.hash_block_size)
        .with_kv_cache_layout(layout)
        .with_store_tp(store_tp)
}

#[test]
fn store_keys_match_vllm() {
    let golden = golden();
    let mut namespace_counts = BTreeSet::new();
    let mut keys_checked = 0;
    for case in &golden.store_keys {
        let what = &case.name;
        let keys = StoreKeys::new(&deployment(case)).unwrap();
        assert_eq!(keys.model_name(), case.model_name, "{what}");
        assert_eq!(keys.namespace().to_string(), case.store_namespace, "{what}");
        for (g, expected) in case.lookup_key_prefixes.iter().enumerate() {
            assert_eq!(
                keys.lookup_prefixes(g).unwrap(),
                expected.as_slice(),
                "{what} group {g}"
            );
        }
        assert_eq!(
            keys.lookup_prefixes(case.lookup_key_prefixes.len()),
            None,
            "{what}"
        );
        namespace_counts.insert(case.lookup_key_prefixes[0].len());

        let hashes: Vec<Vec<u8>> = case.block_hashes.iter().map(|h| unhex(h)).collect();
        let chain = lookup_core::BlockHashes::from_hashes(&hashes).unwrap();
        assert_eq!(
            keys.lookup_keys(case.num_tokens, &chain),
            case.lookup_keys,
            "{what} lookup"
        );
        let r = &case.rank;
        let worker = Ranks::new(r.tp, r.pcp, r.dcp, r.pp);
        assert_eq!(
            keys.put_keys(worker, case.put_tokens, &chain).unwrap(),
            case.put_keys,
            "{what} put"
        );
        assert_eq!(
            keys.mooncake_group_ids(worker, case.put_tokens, &chain)
                .unwrap(),
            case.mooncake_group_ids,
            "{what} group ids"
        );
        keys_checked += case.lookup_keys.len() + case.put_keys.len();
    }
    assert_eq!(golden.store_keys.len(), 14);
    assert!(
        [1, 4, 8].iter().all(|n| namespace_counts.contains(n)),
        "1, 4 and 8 namespaces covered: {namespace_counts:?}"
    );
    assert_eq!(keys_checked, 197);
}
