//! `lookup hash` against vLLM 0.33.0's own block hashes: the golden vectors of
//! `vllm-block-hash` (`crates/vllm-block-hash/tests/golden/vllm-0.33.0.json`, made by
//! `scripts/vllm/golden-vectors.sh` from the released wheel).

use std::process::Command;

use serde_json::Value;

const GOLDEN: &str = include_str!("../../../vllm-block-hash/tests/golden/vllm-0.33.0.json");

/// The case's token ids: a list, or `(start + i * step) % mod` for `i` in `0..count`.
fn tokens(case: &Value) -> Vec<u64> {
    let t = &case["tokens"];
    if let Some(list) = t.as_array() {
        return list.iter().map(|v| v.as_u64().unwrap()).collect();
    }
    let field = |k: &str| t[k].as_u64().unwrap();
    let (start, step, count, modulus) =
        (field("start"), field("step"), field("count"), field("mod"));
    (0..count).map(|i| (start + i * step) % modulus).collect()
}

#[test]
fn hash_prints_vllm_block_hashes_for_both_algorithms_and_seeds() {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    for (i, case) in golden["block_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let extra = case["extra"].as_object().unwrap();
        // The command takes a cache salt; the other extra keys are the library's.
        if extra.keys().any(|k| k != "cache_salt") {
            continue;
        }
        let tokens_file = dir.path().join(format!("tokens-{i}.txt"));
        let list: Vec<String> = tokens(case).iter().map(u64::to_string).collect();
        std::fs::write(&tokens_file, list.join("\n")).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lookup"));
        cmd.arg("hash")
            .arg("--tokens-file")
            .arg(&tokens_file)
            .args(["--block-size", &case["hash_block_size"].to_string()])
            .args(["--hash-algo", case["algo"].as_str().unwrap()]);
        if let Some(seed) = case["pythonhashseed"].as_str() {
            cmd.args(["--pythonhashseed", seed]);
        }
        if let Some(salt) = extra.get("cache_salt") {
            cmd.args(["--cache-salt", salt.as_str().unwrap()]);
        }
        let output = cmd.output().unwrap();
        assert!(output.status.success(), "{:?}", output);
        let expected: Vec<&str> = case["block_hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap())
            .collect();
        let stdout = String::from_utf8(output.stdout).unwrap();
        let got: Vec<&str> = stdout.lines().collect();
        assert_eq!(got, expected, "case {} ({})", case["name"], case["algo"]);
        checked.push(format!(
            "{}/{}",
            case["algo"].as_str().unwrap(),
            case["name"].as_str().unwrap()
        ));
    }
    // Both algorithms, with and without a cache salt, were among the cases.
    for needed in [
        "sha256/cache_salt",
        "sha256_cbor/cache_salt",
        "sha256/block_size_3",
        "sha256_cbor/three_blocks_int_widths",
    ] {
        assert!(
            checked.iter().any(|c| c == needed),
            "{needed} not checked: {checked:?}"
        );
    }
}

#[test]
fn hash_writes_the_file_probe_reads_and_refuses_bad_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hashes.txt");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_lookup"))
            .arg("hash")
            .args(args)
            .output()
            .unwrap()
    };
    // 5 tokens in blocks of 2: two full blocks, the 5th token has no hash.
    let output = run(&[
        "--tokens",
        "5,300,70000,0,1",
        "--block-size",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{output:?}");
    assert!(output.stdout.is_empty());
    let text = std::fs::read_to_string(&out).unwrap();
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    let case = golden["block_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["name"] == "block_size_2" && c["algo"] == "sha256" && c["pythonhashseed"].is_null()
        })
        .unwrap();
    let expected: String = case["block_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| format!("{}\n", h.as_str().unwrap()))
        .collect();
    assert_eq!(text, expected);

    let output = run(&["--tokens-file", "/nonexistent/tokens.txt"]);
    assert_eq!(output.status.code(), Some(2));
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "[1, 2, x]").unwrap();
    let output = run(&["--tokens-file", bad.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: token 2 `x` is not a token id (0 to 2^32-1)\n"
    );
    let output = run(&["--tokens", "1,2", "--hash-algo", "xxhash"]);
    assert_eq!(output.status.code(), Some(2));
    // No input at all is a usage error, not an empty answer.
    let output = run(&[]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    // An empty prompt given explicitly has no full block: no hashes, exit 0.
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let output = run(&["--tokens-file", empty.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
}
