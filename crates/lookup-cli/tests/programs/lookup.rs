//! The `lookup` command-line client against our `LookupServer` and against servers
//! that misbehave: printed results, and exit status with a clear message on a
//! timeout or a malformed reply.

use std::process::{Command, Output};
use std::sync::Arc;

use bytes::Bytes;
use lookup_core::BlockHashes;
use lookup_server::{Endpoint, InMemoryIndex, KeyLayout, LookupServer, ServerConfig};
use lookup_tests::client::{Answer, FakeServer, TempDir, refused_tcp};

const B: u32 = 16;

/// Runs `lookup ARGS` off the runtime's threads.
async fn lookup(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let bin = env!("CARGO_BIN_EXE_lookup");
    tokio::task::spawn_blocking(move || Command::new(bin).args(&args).output())
        .await
        .expect("join")
        .expect("run lookup")
}

/// `lookup probe --endpoint ENDPOINT --num-tokens NUM_TOKENS`, then `extra`.
async fn probe(endpoint: &str, num_tokens: &str, extra: &[&str]) -> Output {
    let mut args = vec!["probe", "--endpoint", endpoint, "--num-tokens", num_tokens];
    args.extend_from_slice(extra);
    lookup(&args).await
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn hash_hex(id: u64) -> String {
    id.to_be_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Stdout without the round-trip line (its value varies), which must be present.
fn without_round_trip(output: &Output) -> Vec<String> {
    let text = stdout(output);
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("round_trip_ms: ")),
        "no round trip in {text:?}"
    );
    lines[..lines.len() - 1].to_vec()
}

fn server(endpoint: &Endpoint, present: &[u64]) -> (LookupServer, Arc<InMemoryIndex>) {
    let layout = KeyLayout::default();
    let index = Arc::new(InMemoryIndex::new());
    index.insert_chain(&layout, &BlockHashes::from_u64s(present), present.len());
    let shared: Arc<InMemoryIndex> = Arc::clone(&index);
    let server = LookupServer::bind(endpoint, ServerConfig::new(B, layout), shared).expect("bind");
    (server, index)
}

/// `lookup probe` in both formats, with hashes inline and from a file, and `lookup
/// reset`, against our server over ipc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_and_reset_against_our_server() {
    let dir = TempDir::new("cli");
    let endpoint = dir.ipc("lookup.sock");
    let (server, index) = server(&endpoint, &[1, 2, 3]);
    let url = endpoint.url();
    let hashes = [1, 2, 3].map(hash_hex).join(",");

    let out = probe(&url, "60", &["--hashes", &hashes]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        without_round_trip(&out),
        vec!["hit_tokens: 48", "boundaries: none"]
    );

    let out = probe(
        &url,
        "60",
        &["--hashes", &hashes, "--format", "msgpack-hex"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        without_round_trip(&out),
        vec!["hit_tokens: 32", "boundaries: none"]
    );

    let file = dir.path().join("hashes.txt");
    std::fs::write(
        &file,
        format!(
            "# a chain\n{}\n\n{}\n{}\n",
            hash_hex(1),
            hash_hex(2),
            hash_hex(9)
        ),
    )
    .expect("write");
    let out = probe(
        &url,
        "48",
        &["--hashes-file", file.to_str().expect("utf-8")],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        without_round_trip(&out),
        vec!["hit_tokens: 32", "boundaries: none"]
    );

    let out = lookup(&["reset", "--endpoint", &url]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(without_round_trip(&out), vec!["ok"]);
    assert_eq!(index.len(), 0);
    server.shutdown().await;
}

/// vLLM's endpoint parts build the ipc path of `spec/wire.md`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_with_vllm_endpoint_parts() {
    let dir = TempDir::new("cliparts");
    let endpoint = Endpoint::vllm(Some(dir.path()), 7, "node-a", 1);
    let (server, _index) = server(&endpoint, &[5, 6]);
    let base = dir.path().to_str().expect("utf-8");
    let hashes = [5, 6].map(hash_hex).join(",");
    let out = lookup(&[
        "probe",
        "--base-path",
        base,
        "--lookup-rpc-port",
        "7",
        "--hostname",
        "node-a",
        "--dp-rank",
        "1",
        "--num-tokens",
        "33",
        "--hashes",
        &hashes,
    ])
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        without_round_trip(&out),
        vec!["hit_tokens: 32", "boundaries: none"]
    );
    server.shutdown().await;
}

/// Tail-key boundaries are printed; a silent server is a timeout (exit 1); malformed
/// replies exit 3 with the reason; bad arguments exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundaries_timeout_malformed_and_usage() {
    // ipc, not a free tcp port: five servers bind it in turn, and a port picked free
    // can be taken by a parallel test between two of them ("Address already in use").
    let dir = TempDir::new("cli-replies");
    let endpoint = dir.ipc("lookup.sock");
    let url = endpoint.url();
    let hashes = [1, 2, 3].map(hash_hex).join(",");
    let with_boundaries = FakeServer::start(&endpoint, |_, _, _| {
        Answer::Raw(vec![Bytes::from_static(&[
            0, 0, 0, 32, 0, 0, 0, 1, 0, 0, 0, 16, 0, 0, 0, 2, 0, 0, 0, 48,
        ])])
    });
    let out = probe(&url, "60", &["--hashes", &hashes]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        without_round_trip(&out),
        vec![
            "hit_tokens: 32",
            "boundaries: group 1 at 16 tokens, group 2 at 48 tokens"
        ]
    );
    with_boundaries.stop().await;

    let silent = FakeServer::silent(&endpoint);
    let out = probe(&url, "60", &["--hashes", &hashes, "--timeout-s", "0.2"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).contains(&format!("error: no reply from {url} within 0.2 s")),
        "{}",
        stderr(&out)
    );
    silent.stop().await;

    for (reply, why) in [
        (
            Bytes::from_static(&[0, 0, 0]),
            "malformed lookup reply of 3 bytes",
        ),
        (
            Bytes::from_static(&[0, 0, 0, 64]),
            "hit_tokens 64 is above num_tokens 60",
        ),
        (
            Bytes::from_static(&[0, 0, 0, 20]),
            "hit_tokens 20 is not a multiple of the block size 16",
        ),
    ] {
        let bad = FakeServer::start(&endpoint, move |_, _, _| Answer::Raw(vec![reply.clone()]));
        let out = probe(&url, "60", &["--hashes", &hashes]).await;
        assert_eq!(out.status.code(), Some(3), "{why}");
        assert!(
            stderr(&out).contains(&format!("error: malformed reply from {url}: {why}")),
            "{}",
            stderr(&out)
        );
        bad.stop().await;
    }

    let out = probe("udp://x", "1", &[]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("bad endpoint `udp://x`"),
        "{}",
        stderr(&out)
    );
    let out = probe(&url, "32", &["--hashes", "abc"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("hash 0 `abc` is not hex of even length"),
        "{}",
        stderr(&out)
    );
    let out = lookup(&["probe", "--num-tokens", "32"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("give --endpoint URL"),
        "{}",
        stderr(&out)
    );
}

/// `lookup probe ARGS --timeout-s 30` against an endpoint nothing listens on: its exit
/// status and stderr, and the wall time, which must stay far below the 30 s a
/// queued ZeroMQ request would wait.
async fn probe_unreachable(url: &str) -> (Output, std::time::Duration) {
    let hashes = [1, 2].map(hash_hex).join(",");
    let started = std::time::Instant::now();
    let out = probe(url, "40", &["--hashes", &hashes, "--timeout-s", "30"]).await;
    let wall = started.elapsed();
    assert!(
        wall < std::time::Duration::from_secs(30),
        "waited out the timeout: {wall:?}"
    );
    (out, wall)
}

/// A missing ipc socket file: exit 4 at once, naming the path (`lookup probe`
/// exits non-zero within 1 s and says which it was: a failure never reads as a miss).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_names_a_missing_ipc_socket_file() {
    let dir = TempDir::new("cli-nofile");
    let endpoint = dir.ipc("no-server.sock");
    let Endpoint::Ipc(path) = &endpoint else {
        unreachable!()
    };
    let url = endpoint.url();
    let (out, wall) = probe_unreachable(&url).await;
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(stdout(&out), "");
    assert_eq!(
        stderr(&out),
        format!(
            "error: {url} is unreachable: no socket file at {} (is the lookup server \
             running, and is the path the one it binds?)\n",
            path.display()
        )
    );
    eprintln!("[lookup probe, missing ipc file] exit 4 after {wall:?} of wall time");
}

/// An ipc socket file nobody accepts on (left by a server that died): exit 4, named
/// as a stale socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_names_a_stale_ipc_socket_file() {
    let dir = TempDir::new("cli-stale");
    let endpoint = dir.ipc("stale.sock");
    let Endpoint::Ipc(path) = &endpoint else {
        unreachable!()
    };
    drop(std::os::unix::net::UnixListener::bind(path).expect("bind"));
    assert!(path.exists(), "the socket file stays behind");
    let url = endpoint.url();
    let (out, _) = probe_unreachable(&url).await;
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(
        stderr(&out),
        format!(
            "error: {url} is unreachable: nothing listens on {} (a stale socket file: the \
             server is dead)\n",
            path.display()
        )
    );
}

/// A refused tcp port: exit 4 at once, naming the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_names_a_refused_tcp_port() {
    let (endpoint, _held) = refused_tcp();
    let Endpoint::Tcp(addr) = &endpoint else {
        unreachable!()
    };
    let url = endpoint.url();
    let (out, wall) = probe_unreachable(&url).await;
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(stdout(&out), "");
    assert_eq!(
        stderr(&out),
        format!(
            "error: {url} is unreachable: connection refused at tcp port {addr} (nothing \
             listens: the server is dead) (is the lookup server running, and is the port \
             the one it binds?)\n"
        )
    );
    eprintln!("[lookup probe, refused tcp port] exit 4 after {wall:?} of wall time");
}
