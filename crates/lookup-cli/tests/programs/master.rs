//! `lookup probe --mooncake-master` and `lookup doctor` against the real Mooncake
//! master (PyPI 0.3.13.post1, blocks written by the real Python store client; needs
//! `scripts/mooncake/install.sh`) and against our lookup server.

use std::process::Output;
use std::sync::Arc;

use lookup_core::BlockHashes;
use lookup_server::{
    Endpoint, InMemoryIndex, KeyLayout, LookupServer, RankNamespace, ServerConfig,
};
use lookup_tests::client::{TempDir, refused_tcp};
use lookup_tests::mooncake::{Master, Writer};

/// Block size in tokens (vLLM's default).
const B: u32 = 16;

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

    // A master that refuses connections: unavailable, with the cause, exit 1, and no
    // hit_tokens line (nothing was answered; a 0 would read as a miss).
    let (refused, _held) = refused_tcp();
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
        format!("outcome: unavailable: {cause}\n")
    );
    assert_eq!(
        text(&out.stderr),
        format!("error: the Mooncake master at {addr} is unavailable: {cause}\n")
    );
}

/// `lookup doctor` against the real master: keys written under the model's last
/// path component, doctor run with the full model name (a common mismatch: the
/// writer's keys carry `Qwen3-8B`, the reader was given `Qwen/Qwen3-8B`). Then with
/// the right name, every check passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_master_doctor_names_a_model_that_differs_from_the_writers() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let ids = [931, 932, 933];
    writer.put(&writers_layout().chain_keys(&BlockHashes::from_u64s(&ids), 3));

    let doctor = |model: &str| {
        let mut words = args(&["doctor", "--mooncake-master", &master.addr()]);
        words.extend(layout_flags(model));
        words.extend(args(&["--num-tokens", "49", "--hashes", &hex_of(&ids)]));
        words
    };
    let out = lookup(doctor("Qwen/Qwen3-8B")).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let keys: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains(" keys: "))
        .collect();
    assert_eq!(
        keys,
        [
            "fail keys: no key with this prefix: vllm@Qwen/Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ \
             (the first block is stored as model Qwen3-8B, cache prefix vllm, tp 2, pp 1); \
             fix: --model Qwen3-8B"
        ]
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ok wire: BatchExistKey answered in ")
                && l.ends_with(": hit_tokens 0 of 49 (miss)")),
        "{stdout}"
    );
    assert!(
        lines.contains(
            &"ok ttl: lookup_prefetch_ttl_s 2 s is below the store's read lease 10 s (from \
              --lease-ttl-s; the master reports its lease only for a key that exists, and the \
              first block's first key is not stored)"
        ),
        "{stdout}"
    );
    assert_eq!(lines.last(), Some(&"doctor: 4 ok, 0 warn, 1 fail"));
    assert_eq!(text(&out.stderr), "error: 1 check(s) failed\n");

    let out = lookup(doctor("Qwen3-8B")).await;
    assert!(out.status.success(), "{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines.contains(
            &"ok keys: the first block is stored under the configured layout (2 of 2 \
              namespace keys, prefix vllm@Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@)"
        ),
        "{stdout}"
    );
    assert!(
        lines.contains(
            &"ok ttl: lookup_prefetch_ttl_s 2 s is below the store's read lease 10 s (reported \
              by the master)"
        ),
        "{stdout}"
    );
    assert_eq!(lines.last(), Some(&"doctor: 5 ok, 0 warn, 0 fail"));
}

/// `lookup doctor` against a master started with a 5 s lease and told the default
/// 10 s (`--lease-ttl-s`): the master's own lease decides, so a 6 s TTL is a warning,
/// printed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_master_doctor_checks_the_ttl_against_the_masters_own_lease() {
    let mut master = Master::spawn(
        lookup_tests::mooncake::free_port(),
        &["-default_kv_lease_ttl=5000".to_owned()],
    );
    master.wait_ready(20);
    let mut writer = Writer::start(&master);
    let ids = [941, 942, 943];
    writer.put(&writers_layout().chain_keys(&BlockHashes::from_u64s(&ids), 3));
    let mut words = args(&["doctor", "--mooncake-master", &master.addr()]);
    words.extend(layout_flags("Qwen3-8B"));
    words.extend(args(&["--num-tokens", "49", "--hashes", &hex_of(&ids)]));
    words.extend(args(&[
        "--lookup-prefetch-ttl-s",
        "6",
        "--lease-ttl-s",
        "10",
    ]));
    let out = lookup(words).await;
    assert!(out.status.success(), "{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    let ttl: Vec<&str> = stdout.lines().filter(|l| l.contains(" ttl: ")).collect();
    assert_eq!(
        ttl,
        [
            "warn ttl: lookup_prefetch_ttl_s 6 s is at or above the store's read lease 5 s \
             (reported by the master): a cached hit may name blocks evicted since; fix: keep \
             lookup_prefetch_ttl_s below the lease (--lookup-prefetch-ttl-s)"
        ]
    );
    assert_eq!(stdout.lines().last(), Some("doctor: 4 ok, 1 warn, 0 fail"));
    // The `ttl` line is the one report of the cause: no WARN of the client repeats it.
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("is not below"))
            .count(),
        0,
        "{stderr}"
    );
}

/// `lookup doctor` with a rank layout that differs from the writers': the first
/// block is found in tp rank 0 and 1 only while 4 ranks are configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_master_doctor_names_a_rank_layout_that_differs() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let ids = [941, 942];
    writer.put(&writers_layout().chain_keys(&BlockHashes::from_u64s(&ids), 2));
    let mut words = args(&["doctor", "--mooncake-master", &master.addr()]);
    words.extend(args(&[
        "--model",
        "Qwen3-8B",
        "--cache-prefix",
        "vllm",
        "--tp-size",
        "4",
    ]));
    words.extend(args(&["--num-tokens", "33", "--hashes", &hex_of(&ids)]));
    let out = lookup(words).await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.lines().any(|l| l
            == "fail keys: 2 of 4 namespace keys of the first block exist under prefix \
                vllm@Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@: the writers' rank \
                layout is tp 2, pp 1; fix: --tp-size 2 --pp-size 1"),
        "{stdout}"
    );
}

/// `lookup doctor` through our lookup server over ipc, with prefetch on: every check
/// passes; then against a path nothing binds: reachability fails with the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_through_a_lookup_server() {
    let dir = TempDir::new("doctor");
    let endpoint = dir.ipc("lookup.sock");
    let layout = KeyLayout::default();
    let index = Arc::new(InMemoryIndex::new());
    index.insert_chain(&layout, &BlockHashes::from_u64s(&[1, 2, 3]), 3);
    let server = LookupServer::bind(&endpoint, ServerConfig::new(B, layout), index).expect("bind");
    let url = endpoint.url();
    let words = |url: &str, extra: &[&str]| {
        let mut words = args(&["doctor", "--endpoint", url, "--num-tokens", "60"]);
        words.extend(args(&["--hashes", &hex_of(&[1, 2, 3])]));
        words.extend(args(extra));
        words
    };
    let out = lookup(words(
        &url,
        &["--lookup-async", "true", "--lookup-prefetch-limit", "8"],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(lines[0].starts_with(&format!("ok reachability: {url} accepts connections (")));
    assert!(lines[1].starts_with("ok wire: tagged-blob reply in "));
    assert!(lines[1].ends_with(": hit_tokens 48 of 60"), "{}", lines[1]);
    assert!(
        lines[2]
            .starts_with("ok prefetch: active (limit 8): a lookup started at arrival answered in "),
        "{}",
        lines[2]
    );
    assert_eq!(
        lines[3],
        "ok ttl: lookup_prefetch_ttl_s 2 s is below the store's read lease 10 s (from \
         --lease-ttl-s; through a lookup server the master's own lease is not known here: the \
         server logs it and exports lookup_server_mooncake_lease_seconds)"
    );
    assert_eq!(lines[4], "doctor: 4 ok, 0 warn, 0 fail");

    // Prefetch configured but inactive, and a TTL above the lease: two warnings.
    let out = lookup(words(
        &url,
        &[
            "--lookup-prefetch-limit",
            "8",
            "--lookup-prefetch-ttl-s",
            "12",
        ],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[2..],
        [
            "warn prefetch: configured but inactive: lookup_prefetch_limit 8 with lookup_async \
             false starts no lookup at arrival; fix: --lookup-async true, or --lookup-prefetch-limit 0",
            "warn ttl: lookup_prefetch_ttl_s 12 s is at or above the store's read lease 10 s \
             (from --lease-ttl-s; through a lookup server the master's own lease is not known \
             here: the server logs it and exports lookup_server_mooncake_lease_seconds): a \
             cached hit may name blocks evicted since; fix: keep lookup_prefetch_ttl_s below the \
             lease (--lookup-prefetch-ttl-s)",
            "doctor: 2 ok, 2 warn, 0 fail",
        ]
    );

    // A prompt the store does not hold: the 0 is flagged, with where to look next.
    let mut cold = args(&["doctor", "--endpoint", &url, "--num-tokens", "60"]);
    cold.extend(args(&["--hashes", &hex_of(&[7, 8, 9])]));
    let out = lookup(cold).await;
    assert!(out.status.success(), "{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    let keys: Vec<&str> = stdout.lines().filter(|l| l.contains(" keys: ")).collect();
    assert_eq!(
        keys,
        [
            "warn keys: the server answered 0 hit tokens: a cold cache, or a key layout (model, \
             cache prefix, ranks) that differs from the writers'; through a lookup server the \
             store's keys are not checked; fix: run lookup doctor --mooncake-master ADDR with \
             the server's --model, --cache-prefix, --tp-size and --pp-size"
        ]
    );
    server.shutdown().await;

    let missing = dir.ipc("typo.sock");
    let Endpoint::Ipc(path) = &missing else {
        unreachable!()
    };
    let out = lookup(words(&missing.url(), &[])).await;
    assert_eq!(out.status.code(), Some(1));
    // Only reachability was observed: prefetch and ttl are not checked, not `ok`.
    assert_eq!(
        text(&out.stdout),
        format!(
            "fail reachability: {}: no socket file at {}; fix: start the lookup server, or \
             give the endpoint it binds (--endpoint, or vLLM's \
             --base-path/--lookup-rpc-port/--hostname/--dp-rank)\n\
             not checked prefetch: off by the settings (sync lookups, lookup_async false); no \
             lookup was tried: the store is unreachable\n\
             not checked ttl: the store is unreachable, so its read lease is not known \
             (lookup_prefetch_ttl_s 2 s is below --lease-ttl-s 10 s)\n\
             doctor: 0 ok, 0 warn, 1 fail, 2 not checked\n",
            missing.url(),
            path.display()
        )
    );
    // With prefetch on, the same: not tried, so not checked.
    let out = lookup(words(
        &missing.url(),
        &["--lookup-async", "true", "--lookup-prefetch-limit", "8"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[1..],
        [
            "not checked prefetch: active by the settings (limit 8), not tried: the store is \
             unreachable",
            "not checked ttl: the store is unreachable, so its read lease is not known \
             (lookup_prefetch_ttl_s 2 s is below --lease-ttl-s 10 s)",
            "doctor: 0 ok, 0 warn, 1 fail, 2 not checked",
        ]
    );
}

/// A `--mooncake-master` that is not an address is a bad argument: exit 2 with the
/// reason, nothing on stdout (no `hit_tokens`, no doctor line), for `probe` and
/// `doctor` alike.
#[tokio::test]
async fn a_malformed_master_address_is_a_usage_error() {
    for command in ["probe", "doctor"] {
        let mut words = args(&[command, "--mooncake-master", "not-a-host"]);
        words.extend(args(&["--num-tokens", "32", "--hashes", &hex_of(&[1, 2])]));
        let out = lookup(words).await;
        assert_eq!(out.status.code(), Some(2), "{command}");
        assert_eq!(text(&out.stdout), "", "{command}");
        assert_eq!(
            text(&out.stderr),
            "error: --mooncake-master: invalid Mooncake master address not-a-host: expected \
             host:port\n",
            "{command}"
        );
    }
}
