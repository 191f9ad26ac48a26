//! `lookup doctor` and `lookup probe --mooncake-master` against the real Mooncake
//! master with a TP 2 x DCP 2 deployment's keys (written as vLLM 0.33's workers write
//! them: `vllm_block_hash::StoreKeys::put_keys`), one DCP shard of block 2 missing.
//! The true answer is 32 tokens; a lookup that asks only rank 0's shard claims 64
//! (vLLM #46855). The doctor's advice must give the true answer.

use lookup_core::BlockHashes;
use lookup_tests::mooncake::{Master, Writer};
use vllm_block_hash::{Deployment, Parallelism, Ranks, StoreKeys};

use crate::master::lookup;

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|w| (*w).to_owned()).collect()
}

fn hex_of(ids: &[u64]) -> String {
    let hex: Vec<String> = ids.iter().map(|id| format!("{id:016x}")).collect();
    hex.join(",")
}

/// The `keys` line of a doctor's stdout.
fn keys_line(stdout: &str) -> String {
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(" keys: ")).collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    lines[0].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_advice_on_a_dcp_layout_with_a_missing_shard_gives_the_true_answer() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let keys = StoreKeys::new(
        &Deployment::new("Qwen/Qwen3-8B", 16)
            .with_cache_prefix("vllm")
            .with_parallelism(Parallelism::tp(2).with_dcp(2)),
    )
    .expect("store keys");
    let ids = [951, 952, 953, 954];
    let hashes = BlockHashes::from_u64s(&ids);
    let rank0 = keys.put_keys(Ranks::new(0, 0, 0, 0), 64, &hashes).unwrap();
    let mut rank1 = keys.put_keys(Ranks::new(1, 0, 1, 0), 64, &hashes).unwrap();
    assert_eq!(
        rank1[2],
        format!(
            "vllm@Qwen3-8B@tp_rank:1@pcp0@dcp1@pp_rank:0@group:0@{:016x}",
            953
        )
    );
    rank1.remove(2); // DCP rank 1 lost its shard of block 2.
    writer.put(&rank0);
    writer.put(&rank1);

    let master_addr = master.addr();
    let with = |command: &str, sizes: &[String]| {
        let mut args = words(&[
            command,
            "--mooncake-master",
            &master_addr,
            "--model",
            "Qwen3-8B",
            "--cache-prefix",
            "vllm",
            "--num-tokens",
            "65",
            "--hashes",
            &hex_of(&ids),
        ]);
        args.extend_from_slice(sizes);
        args
    };

    // The layout as a user without DCP flags states it: TP 2 asks tp 1's dcp0, which
    // nobody writes. The doctor names the writers' ranks and the flags.
    let out = lookup(with("doctor", &words(&["--tp-size", "2"]))).await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        keys_line(&stdout),
        "fail keys: 1 of 2 namespace keys of the first block exist under prefix \
         vllm@Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@: the writers' rank layout is \
         tp 2, pp 1, dcp 2; fix: --tp-size 2 --pp-size 1 --dcp-size 2"
    );
    // TP 1 asks rank 0 only, whose shards are all there: the old advice. The doctor
    // now sees the shards it does not ask and refuses the layout.
    let out = lookup(with("doctor", &words(&["--tp-size", "1"]))).await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = keys_line(&stdout);
    assert_eq!(
        line,
        "fail keys: the first block is stored under prefix \
         vllm@Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@, and also in namespaces the \
         layout does not ask (the writers' ranks are tp 2, pp 1, dcp 2): the lookup would \
         claim blocks those ranks lack; fix: --tp-size 2 --pp-size 1 --dcp-size 2"
    );
    let (_, fix) = line.split_once("; fix: ").unwrap();
    let advised: Vec<String> = fix.split_whitespace().map(str::to_owned).collect();

    // What the old advice answered: 64, a false positive.
    let out = lookup(with("probe", &words(&["--tp-size", "1"]))).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("hit_tokens: 64\n"),
        "{out:?}"
    );
    // With the advice: the true answer, 32.
    let out = lookup(with("probe", &advised)).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("hit_tokens: 32\n"),
        "{out:?}"
    );
    // And the doctor agrees with its own advice: the keys check passes.
    let out = lookup(with("doctor", &advised)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        keys_line(&stdout),
        "ok keys: the first block is stored under the configured layout (2 of 2 namespace \
         keys, prefix vllm@Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dcp_size_that_does_not_divide_tp_is_a_usage_error() {
    let out = lookup(words(&[
        "probe",
        "--mooncake-master",
        "127.0.0.1:1",
        "--tp-size",
        "2",
        "--dcp-size",
        "4",
        "--num-tokens",
        "32",
        "--hashes",
        &hex_of(&[1, 2]),
    ]))
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: --dcp-size 4 does not divide --tp-size 2 (decode context parallelism \
         subdivides the TP ranks)\n"
    );
}
