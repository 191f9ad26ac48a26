//! The `lookup-server` program as an operator runs it: its `--metrics-addr` exporter
//! over HTTP, and `--mooncake-master` answering from the real Mooncake master (PyPI
//! 0.3.13.post1, blocks written by the real Python store client; needs
//! `scripts/mooncake/install.sh`), with its clients' TTL checked against the master's
//! own read lease.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use lookup_core::BlockHashes;
use lookup_core::wire::{self, Format};
use lookup_server::{Endpoint, KeyLayout, RankNamespace};
use lookup_tests::metrics::{call, expect, free_addr, scrape};
use lookup_tests::mooncake::{Master, Writer};
use lookup_tests::server::{Req, hit, lookup};
use tempfile::TempDir;

/// Block size in tokens (vLLM's default).
const B: u32 = 16;
/// As vLLM keys it (the last path component of `--model Qwen/Qwen3-8B`).
const MODEL: &str = "Qwen3-8B";
const TB: Format = Format::TaggedBlob;
const MP: Format = Format::MsgpackHex;

/// The keys of blocks `ids` in every namespace of `layout`, block-major: what a
/// worker's puts leave in the store.
fn keys_of(layout: &KeyLayout, ids: &[u64]) -> Vec<String> {
    layout.chain_keys(&BlockHashes::from_u64s(ids), ids.len())
}

/// A layout with a cache prefix and `tp_size` tensor-parallel namespaces.
fn layout(tp_size: u32) -> KeyLayout {
    KeyLayout::new(MODEL)
        .with_cache_prefix(Some("vllm".to_owned()))
        .with_namespaces(RankNamespace::grid(tp_size, 1))
        .expect("namespaces")
}

/// `n` chained block ids starting at `first`.
fn chain(first: u64, n: u64) -> Vec<u64> {
    (first..first + n).collect()
}

/// The program's first stdout line: the endpoint it bound, printed once bound.
pub(crate) async fn first_line(child: &mut lookup_tests::KilledOnDrop) -> String {
    let stdout = child.0.stdout.take().expect("piped stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    tokio::time::timeout(Duration::from_secs(30), line)
        .await
        .expect("lookup-server printed no endpoint within 30 s")
        .expect("join")
        .expect("read stdout")
}

/// `lookup-server --metrics-addr`: the program serves its server metrics over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_server_program_serves_metrics() {
    let metrics_addr = free_addr();
    let bin = env!("CARGO_BIN_EXE_lookup-server");
    let mut child = lookup_tests::KilledOnDrop(
        Command::new(bin)
            .args(["--bind", "tcp://127.0.0.1:0", "--block-size", "16"])
            .args(["--metrics-addr", &metrics_addr.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run lookup-server"),
    );
    // The first line is the bound endpoint; the exporter is installed before it.
    let line = first_line(&mut child).await;
    let endpoint: Endpoint = line.trim_end().parse().expect("an endpoint");

    let hashes = BlockHashes::from_u64s(&[1, 2, 3]);
    let frames = wire::encode_lookup(Format::TaggedBlob, 50, B, &hashes);
    let frames: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
    let reply = call(&endpoint, &frames).await;
    assert_eq!(
        reply,
        vec![Bytes::from_static(&[0, 0, 0, 0])],
        "empty store"
    );

    expect(
        &scrape(metrics_addr).await,
        &[
            (
                "lookup_server_requests_total{format=\"tagged-blob\",kind=\"lookup\"}",
                1.0,
            ),
            ("lookup_server_keys_checked_total", 3.0),
            ("lookup_server_index_latency_seconds_count", 1.0),
            (
                "lookup_server_decode_errors_total{format=\"tagged-blob\"}",
                0.0,
            ),
        ],
    );
    drop(child);
}

#[tokio::test]
async fn mooncake_master_lookup_server_program_answers_from_the_master() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let layout = layout(2);
    let ids = chain(801, 4);
    writer.put(&keys_of(&layout, &ids[..2]));

    let dir = TempDir::new().expect("temp dir");
    let endpoint = Endpoint::Ipc(dir.path().join("lookup.sock"));
    let bin = env!("CARGO_BIN_EXE_lookup-server");
    let mut child = lookup_tests::KilledOnDrop(
        Command::new(bin)
            .args(["--bind", &endpoint.url()])
            .args(["--mooncake-master", &master.addr()])
            .args(["--mooncake-chunk-keys", "4"])
            .args(["--mooncake-timeout-ms", "500"])
            .args(["--model", MODEL, "--cache-prefix", "vllm", "--tp-size", "2"])
            .args(["--block-size", &B.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run lookup-server"),
    );
    let line = first_line(&mut child).await;
    assert_eq!(line.trim_end(), endpoint.url());

    let ctx = tmq::Context::new();
    let mut req = Req::connect(&ctx, &endpoint);
    assert_eq!(hit(TB, &req.call(&lookup(TB, 65, B, &ids)).await), 32);
    assert_eq!(hit(MP, &req.call(&lookup(MP, 65, B, &ids)).await), 32);
    let reply = req.call(&wire::encode_reset(TB).unwrap()).await;
    assert_eq!(wire::decode_reset_reply(&reply), Ok(false));
    writer.put(&keys_of(&layout, &ids[2..]));
    // All 4 blocks of a 64-token prompt: the last one is recomputed.
    assert_eq!(hit(TB, &req.call(&lookup(TB, 64, B, &ids)).await), 48);
    drop(child);
}

/// `lookup-server --mooncake-master --client-ttl-s 6` in front of a master started with
/// a 5 s lease (told 10 s with `--mooncake-lease-ttl-s`): no warning at start, then,
/// at the first hit, the master's own lease is read, exported and warned about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_master_lookup_server_program_checks_its_clients_ttl_against_the_lease() {
    let mut master = Master::spawn(
        lookup_tests::mooncake::free_port(),
        &["-default_kv_lease_ttl=5000".to_owned()],
    );
    master.wait_ready(20);
    let mut writer = Writer::start(&master);
    let layout = layout(2);
    let ids = chain(901, 4);
    writer.put(&keys_of(&layout, &ids));

    let dir = TempDir::new().expect("temp dir");
    let endpoint = Endpoint::Ipc(dir.path().join("lookup.sock"));
    let metrics_addr = free_addr();
    let bin = env!("CARGO_BIN_EXE_lookup-server");
    let mut child = lookup_tests::KilledOnDrop(
        Command::new(bin)
            .args(["--bind", &endpoint.url()])
            .args(["--mooncake-master", &master.addr()])
            .args(["--mooncake-lease-ttl-s", "10", "--client-ttl-s", "6"])
            .args(["--model", MODEL, "--cache-prefix", "vllm", "--tp-size", "2"])
            .args(["--block-size", &B.to_string()])
            .args(["--metrics-addr", &metrics_addr.to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run lookup-server"),
    );
    let line = first_line(&mut child).await;
    assert_eq!(line.trim_end(), endpoint.url());
    // Every stderr line, read on a thread of its own until the program exits.
    let stderr = child.0.stderr.take().expect("piped stderr");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let gauge = "lookup_server_mooncake_lease_seconds";
    expect(&scrape(metrics_addr).await, &[(gauge, 10.0)]);

    let ctx = tmq::Context::new();
    let mut req = Req::connect(&ctx, &endpoint);
    assert_eq!(hit(TB, &req.call(&lookup(TB, 65, B, &ids)).await), 64);
    let warning = tokio::time::timeout(Duration::from_secs(20), async {
        let mut seen = Vec::new();
        while let Some(line) = lines.recv().await {
            if line.contains("is not below") {
                return (line, seen);
            }
            seen.push(line);
        }
        panic!("lookup-server exited without the lease warning: {seen:#?}");
    })
    .await
    .expect("no lease warning within 20 s");
    assert!(
        warning.0.contains(
            "WARN mooncake_master::batch::lease: the clients' lookup_prefetch_ttl_s \
             (--client-ttl-s) of 6 s is not below the Mooncake master's read lease (5 s, \
             reported by the master)"
        ),
        "{}",
        warning.0
    );
    assert!(
        warning.1.iter().all(|l| !l.contains("WARN")),
        "no warning before the lease was read: {:#?}",
        warning.1
    );
    // The gauge follows the read, not the next hit.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lookup_tests::metrics::value(&scrape(metrics_addr).await, gauge) != Some(5.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "{gauge} not 5 within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(child);
}

/// `lookup-server --model Qwen/Qwen3-8B`: vLLM's worker would key such a deployment by
/// `Qwen3-8B`, so the verbatim name is warned about at start, with the fix.
#[tokio::test]
async fn lookup_server_program_warns_about_a_model_name_vllm_does_not_key_by() {
    let bin = env!("CARGO_BIN_EXE_lookup-server");
    let mut child = lookup_tests::KilledOnDrop(
        Command::new(bin)
            .args(["--bind", "tcp://127.0.0.1:0", "--model", "Qwen/Qwen3-8B"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run lookup-server"),
    );
    let stderr = child.0.stderr.take().expect("piped stderr");
    let warning = tokio::task::spawn_blocking(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("WARN"))
    });
    let warning = tokio::time::timeout(Duration::from_secs(30), warning)
        .await
        .expect("no warning within 30 s")
        .expect("join")
        .expect("a warning before exit");
    assert!(
        warning.ends_with(
            "store keys carry --model verbatim (Qwen/Qwen3-8B), while vLLM's worker keys by \
             the last path component of its --model (Qwen3-8B): give --model Qwen3-8B if the \
             writers are vLLM engines model=\"Qwen/Qwen3-8B\""
        ),
        "{warning}"
    );
    drop(child);
}

/// Arguments `lookup-server` cannot use exit 2 before anything starts, as clap's own
/// refusals do, each with its reason on stderr: a `--mooncake-master` that is not an
/// address, no `--bind` or `--hostname`, a rank layout that does not divide.
#[test]
fn lookup_server_program_exits_2_for_arguments_that_make_no_sense() {
    let bin = env!("CARGO_BIN_EXE_lookup-server");
    for (words, reason) in [
        (
            &[
                "--bind",
                "tcp://127.0.0.1:0",
                "--mooncake-master",
                "not-a-host",
            ][..],
            "lookup-server: --mooncake-master not-a-host: invalid Mooncake master address \
             not-a-host: expected host:port\n",
        ),
        (&["--model", "m"][..], ""), // clap's: --hostname is required
        // clap's: a block of 0 tokens aligns nothing.
        (
            &["--bind", "tcp://127.0.0.1:0", "--block-size", "0"][..],
            "",
        ),
        (
            &[
                "--bind",
                "tcp://127.0.0.1:0",
                "--tp-size",
                "2",
                "--dcp-size",
                "3",
            ][..],
            "",
        ),
    ] {
        let out = Command::new(bin)
            .args(words)
            .stdin(Stdio::null())
            .output()
            .expect("run lookup-server");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{words:?}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{words:?}");
        if !reason.is_empty() {
            assert_eq!(stderr, reason, "{words:?}");
        }
    }
}
