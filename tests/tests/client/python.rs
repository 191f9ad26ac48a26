//! Interop with an independent peer (`tests/python/peer.py`, pyzmq, written from
//! `spec/wire.md` alone): our `LookupClient` against its REP server, and its REQ
//! client against our `LookupServer`, byte for byte, in both formats.
//!
//! Needs `python3` with pyzmq (`pip install pyzmq==27.3.0`). Without it the tests
//! skip with a message, except when `CI=true`, where they fail.

use lookup_tokio::Deadline;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use lookup_core::BlockHashes;
use lookup_core::wire::{self, Format, LookupReply};
use lookup_core::{Probe, ResetOutcome};
use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
use lookup_tests::client::{TempDir, free_tcp, reference_hit, request};
use lookup_tokio::{ClientConfig, Endpoint, KeyLayout, LookupClient};

const B: u32 = 16;

fn peer_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join("peer.py")
}

/// True when `python3 -c "import zmq"` works. Panics when it does not and `CI=true`.
fn python_with_pyzmq() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import zmq"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but `python3 -c \"import zmq\"` fails: install pyzmq==27.3.0"
        );
        eprintln!("skipped: python3 with pyzmq is not available (pip install pyzmq==27.3.0)");
    }
    ok
}

/// A child process killed on drop (a failing test must not leave a server behind).
struct Peer(Option<Child>);

impl Peer {
    fn spawn(args: &[&str]) -> Self {
        let child = Command::new("python3")
            .arg(peer_script())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python3 peer.py");
        Self(Some(child))
    }

    /// Waits for the process (off the runtime's threads) and returns its stdout lines.
    async fn finish(mut self) -> Vec<String> {
        let child = self.0.take().expect("running");
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .expect("join")
            .expect("wait for peer.py");
        assert!(
            output.status.success(),
            "peer.py failed: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout)
            .expect("utf-8")
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `peer.py probe|reset` to completion: its stdout lines.
async fn run_peer(args: Vec<String>) -> Vec<String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Peer::spawn(&args).finish().await
}

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "-".to_owned();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The line peer.py prints for a message: `request` and each frame's hex.
fn request_line(frames: &[bytes::Bytes]) -> String {
    let frames: Vec<String> = frames.iter().map(|f| hex(f)).collect();
    format!("request {}", frames.join(" "))
}

fn hash_list(ids: &[u64]) -> String {
    ids.iter()
        .map(|id| hex(&id.to_be_bytes()))
        .collect::<Vec<_>>()
        .join(",")
}

fn ready(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

/// Waits (at most 20 s) until a server has bound `endpoint`'s ipc socket file.
fn wait_for_socket_file(endpoint: &Endpoint) {
    let path = endpoint.ipc_path().expect("an ipc endpoint");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing bound {} within 20 s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Our client (sync mode, DEALER with an RPC-id envelope) against peer.py's REP
/// server: the server sees exactly the frames of `spec/wire.md`, and we decode its
/// answers; in `tagged-blob`, a reset wipes its blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_python_rep_server() {
    if !python_with_pyzmq() {
        return;
    }
    let dir = TempDir::new("pyrep");
    for format in [Format::TaggedBlob, Format::MsgpackHex] {
        let endpoint = dir.ipc(&format!("{format}.sock"));
        let reset = format == Format::TaggedBlob;
        let count = if reset { 4 } else { 2 };
        let peer = Peer::spawn(&[
            "serve",
            "--endpoint",
            &endpoint.url(),
            "--block-size",
            "16",
            "--present",
            &hash_list(&[1, 2, 3]),
            "--count",
            &count.to_string(),
        ]);
        // Lookups sent before the peer binds fail fast as unavailable (the client
        // checks its endpoint): wait until Python has started and bound.
        wait_for_socket_file(&endpoint);
        let mut config = ClientConfig::zmq(endpoint.clone(), B);
        config.transport.zmq_mut().expect("zmq").format = format;
        let mut client = LookupClient::connect_lazy(config).expect("connect");
        let a = request(1, 60, &[1, 2, 3]);
        let b = request(2, 48, &[1, 9, 3]);
        // msgpack-hex sends 48 (floored): all three blocks, so the full-hit rule applies.
        let hit_a = if reset { 48 } else { 32 };
        assert_eq!(
            client.probe_until(&a, 0, Deadline::Answer).await,
            ready(hit_a),
            "{format}"
        );
        assert_eq!(
            client.probe_until(&b, 0, Deadline::Answer).await,
            ready(16),
            "{format}"
        );
        let mut expected = vec![
            request_line(&wire::encode_lookup(format, 60, B, &a.block_hashes)),
            request_line(&wire::encode_lookup(format, 48, B, &b.block_hashes)),
        ];
        if reset {
            assert_eq!(
                client.reset_and_wait().await.expect("open"),
                ResetOutcome::Ok
            );
            let again = request(3, 60, &[1, 2, 3]);
            assert_eq!(
                client.probe_until(&again, 0, Deadline::Answer).await,
                ready(0),
                "after reset"
            );
            expected.push("request 7265736574".to_owned()); // "reset"
            expected.push(request_line(&wire::encode_lookup(
                format,
                60,
                B,
                &again.block_hashes,
            )));
        }
        let lines = peer.finish().await;
        let requests: Vec<String> = lines
            .into_iter()
            .filter(|l| l.starts_with("request"))
            .collect();
        assert_eq!(requests, expected, "{format}");
        let stats = client.stats();
        assert_eq!(
            (
                stats.core.failed_malformed,
                stats.late_replies,
                stats.bad_envelopes
            ),
            (0, 0, 0)
        );
        client.close();
    }
}

/// peer.py's REQ client against our `LookupServer` (over tcp and ipc): replies are
/// exactly the bytes of `spec/wire.md`, hits follow the reference semantics, and a
/// reset answers `0x01`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_req_client_against_our_server() {
    if !python_with_pyzmq() {
        return;
    }
    let dir = TempDir::new("pyreq");
    let layout = KeyLayout::default();
    let index = Arc::new(InMemoryIndex::new());
    let stored = BlockHashes::from_u64s(&[1, 2, 3]);
    index.insert_chain(&layout, &stored, 3);
    let present = |h: &[u8]| [1u64, 2, 3].iter().any(|id| id.to_be_bytes() == h);
    for (endpoint, format) in [
        (free_tcp(), Format::TaggedBlob),
        (dir.ipc("ours.sock"), Format::MsgpackHex),
    ] {
        let shared: Arc<InMemoryIndex> = Arc::clone(&index);
        let server = LookupServer::bind(&endpoint, ServerConfig::new(B, layout.clone()), shared)
            .expect("bind");
        let endpoint: Endpoint = server.local_endpoint().clone();
        for (num_tokens, ids) in [
            (60u32, vec![1u64, 2, 3]),
            (48, vec![1, 2, 3]),
            (40, vec![1, 7, 3]),
            (15, vec![1]),
        ] {
            let lines = run_peer(vec![
                "probe".into(),
                "--endpoint".into(),
                endpoint.url(),
                "--format".into(),
                format.to_string(),
                "--block-size".into(),
                B.to_string(),
                "--num-tokens".into(),
                num_tokens.to_string(),
                "--hashes".into(),
                hash_list(&ids),
            ])
            .await;
            let hashes = BlockHashes::from_u64s(&ids);
            let sent = match format {
                Format::TaggedBlob => num_tokens,
                Format::MsgpackHex => num_tokens / B * B,
            };
            let hit = reference_hit(sent, B, &hashes, &present);
            let reply = wire::encode_lookup_reply(
                format,
                &LookupReply {
                    hit_tokens: hit,
                    boundaries: vec![],
                },
            );
            assert_eq!(
                lines,
                vec![
                    request_line(&wire::encode_lookup(format, num_tokens, B, &hashes)),
                    format!("reply {}", hex(&reply)),
                    format!("hit_tokens {hit}"),
                ],
                "{format} {num_tokens} {ids:?}"
            );
        }
        if format == Format::TaggedBlob {
            let lines = run_peer(vec!["reset".into(), "--endpoint".into(), endpoint.url()]).await;
            assert_eq!(lines, vec!["reply 01".to_owned(), "ok".to_owned()]);
            index.insert_chain(&layout, &stored, 3);
        }
        let stats = server.stats();
        assert_eq!((stats.decode_errors, stats.unknown_tags), (0, 0));
        server.shutdown().await;
    }
}
