//! `lookup probe --mooncake-master` against the real Mooncake master (PyPI
//! 0.3.13.post1, blocks written by the real Python store client; needs
//! `scripts/mooncake/install.sh`).

use std::process::Output;

use lookup_core::BlockHashes;
use lookup_server::{Endpoint, KeyLayout, RankNamespace};
use lookup_tests::client::free_tcp;
use lookup_tests::mooncake::{Master, Writer};

/// Runs `lookup ARGS` off the runtime's threads.
pub(crate) async fn lookup(args: Vec<String>) -> Output {
    let bin = env!("CARGO_BIN_EXE_lookup");
    tokio::task::spawn_blocking(move || std::process::Command::new(bin).args(&args).output())
        .await
        .expect("join")
        .expect("run lookup")
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Stdout's lines without the last one, which must start with `last`.
fn lines_before(out: &Output, last: &str) -> Vec<String> {
    let stdout = text(&out.stdout);
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    assert!(
        lines.last().is_some_and(|l| l.starts_with(last)),
        "no {last:?} line at the end of {stdout:?}; stderr {}",
        text(&out.stderr)
    );
    lines[..lines.len() - 1].to_vec()
}

fn hex_of(ids: &[u64]) -> String {
    ids.iter()
        .map(|id| {
            id.to_be_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The writers' layout in these tests: the model's last path component (as vLLM
/// names it in keys), a cache prefix, 2 tensor-parallel ranks.
fn writers_layout() -> KeyLayout {
    KeyLayout::new("Qwen3-8B")
        .with_cache_prefix(Some("vllm".to_owned()))
        .with_namespaces(RankNamespace::grid(2, 1))
        .expect("namespaces")
}

/// The flags of `writers_layout` with `model` as the model name.
fn layout_flags(model: &str) -> Vec<String> {
    args(&["--model", model, "--cache-prefix", "vllm", "--tp-size", "2"])
}

/// `lookup probe --mooncake-master`: a hit, a miss and an unavailable master, each
/// with its outcome, through the direct transport's rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_master_probe_prints_hit_miss_and_unavailable() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let layout = writers_layout();
    let ids = [901, 902, 903, 904];
    writer.put(&layout.chain_keys(&BlockHashes::from_u64s(&ids[..2]), 2));

    let probe = |hashes: &[u64], num_tokens: u32, addr: &str| {
        let mut words = args(&["probe", "--mooncake-master", addr]);
        words.extend(layout_flags("Qwen3-8B"));
        words.extend(args(&["--num-tokens", &num_tokens.to_string()]));
        words.extend(args(&["--hashes", &hex_of(hashes), "--block-size", "16"]));
        words
    };
    // 65 tokens, 4 full blocks, 2 stored: 32 hit tokens; 8 keys asked in one call.
    let out = lookup(probe(&ids, 65, &master.addr())).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines_before(&out, "round_trip_ms: "),
        ["hit_tokens: 32", "outcome: hit", "keys_asked: 8"]
    );
    // Nothing of this chain is stored: the first block's 2 keys answer it.
    let out = lookup(probe(&[950, 951], 40, &master.addr())).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines_before(&out, "round_trip_ms: "),
        ["hit_tokens: 0", "outcome: miss", "keys_asked: 4"]
    );
    // 15 tokens: no full block, nothing asked.
    let out = lookup(probe(&ids, 15, &master.addr())).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines_before(&out, "round_trip_ms: "),
        [
            "hit_tokens: 0",
            "outcome: not needed (no full block to ask about)",
            "keys_asked: 0"
        ]
    );

    // A master that refuses connections: unavailable, with the cause, exit 1.
    let refused = free_tcp();
    let Endpoint::Tcp(addr) = &refused else {
        unreachable!()
    };
    let out = lookup(probe(&ids, 65, addr)).await;
    assert_eq!(out.status.code(), Some(1));
    let cause = format!(
        "cannot connect to the Mooncake master at {addr}: Connection refused (os error 111)"
    );
    assert_eq!(
        text(&out.stdout),
        format!("hit_tokens: 0\noutcome: unavailable: {cause}\n")
    );
    assert_eq!(
        text(&out.stderr),
        format!("error: the Mooncake master at {addr} is unavailable: {cause}\n")
    );
}
