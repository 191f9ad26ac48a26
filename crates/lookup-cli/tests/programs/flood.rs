//! `lookup-server` under hostile input, as an operator runs it with the defaults: a
//! flood of garbage, frames of exactly `max_frame_bytes`, maximal well-formed lookups
//! and frames over the limit from several ZeroMQ peers, next to a good client whose
//! answers must stay exact. The server's resident memory (`VmRSS`, and `VmHWM` for the
//! peak, from `/proc/PID/status`) must stay under 64 MiB and be back within 16 MiB of
//! its start 5 s after the flood (RELIABILITY.md, "Security"). And `--max-frame-bytes`
//! sets the limit a peer is cut off at.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lookup_core::wire::Format;
use lookup_server::{DEFAULT_MAX_FRAME_BYTES, Endpoint};
use lookup_tests::fault::status_field;
use lookup_tests::flood::Flood;
use lookup_tests::server::{DealerClient, Req, hit, lookup};
use tempfile::TempDir;

use crate::server::first_line;

const B: u32 = 16;
const TB: Format = Format::TaggedBlob;
/// Flooding peers.
const PEERS: usize = 3;
/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(6);
/// The bounds of the goal, in kB (`/proc` units: KiB).
const PEAK_KIB: u64 = 64 * 1024;
const BACK_WITHIN_KIB: u64 = 16 * 1024;

/// The good client's lookup: blocks 1 and 2 of 1, 2, 3 are stored: 32 hit tokens.
async fn good_lookup(req: &mut Req) -> u32 {
    hit(TB, &req.call(&lookup(TB, 48, B, &[1, 2, 3])).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_server_memory_stays_bounded_under_a_flood() {
    let dir = TempDir::new().expect("temp dir");
    let preload = dir.path().join("hashes.txt");
    std::fs::write(&preload, "0000000000000001\n0000000000000002\n").expect("write preload");
    let bin = env!("CARGO_BIN_EXE_lookup-server");
    let mut child = lookup_tests::KilledOnDrop(
        Command::new(bin)
            .args(["--bind", "tcp://127.0.0.1:0", "--block-size", "16"])
            .arg("--preload")
            .arg(&preload)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run lookup-server"),
    );
    let pid = child.0.id();
    let endpoint: Endpoint = first_line(&mut child)
        .await
        .trim_end()
        .parse()
        .expect("an endpoint");
    let ctx = tmq::Context::new();
    let mut req = Req::connect(&ctx, &endpoint);
    assert_eq!(good_lookup(&mut req).await, 32);
    let start = status_field(Some(pid), "VmRSS");

    let flood = Flood::start(&endpoint, DEFAULT_MAX_FRAME_BYTES, PEERS);
    let until = Instant::now() + FLOOD;
    let mut answered = 0u32;
    let mut peak = start;
    while Instant::now() < until {
        assert_eq!(
            good_lookup(&mut req).await,
            32,
            "good client, lookup {answered}"
        );
        answered += 1;
        peak = peak.max(status_field(Some(pid), "VmRSS"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (sent, bytes) = flood.sent();
    flood.stop().await;
    let hwm = status_field(Some(pid), "VmHWM");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = status_field(Some(pid), "VmRSS");
    assert_eq!(
        good_lookup(&mut req).await,
        32,
        "good client after the flood"
    );
    eprintln!(
        "flood: {PEERS} peers, {sent} messages, {} MiB in {FLOOD:?}; good lookups {answered}, \
         all exact; server VmRSS {start} kB at start, VmHWM {hwm} kB (sampled peak {peak} kB), \
         {after} kB 5 s after",
        bytes >> 20
    );
    assert!(sent > 100, "the flood sent only {sent} messages");
    assert!(answered > 10, "the good client got only {answered} answers");
    assert!(hwm < PEAK_KIB, "VmHWM {hwm} kB, not under 64 MiB");
    assert!(
        after <= start + BACK_WITHIN_KIB,
        "VmRSS {after} kB 5 s after the flood, started at {start} kB"
    );
    drop(child);
}

/// `--max-frame-bytes` reaches the socket: a peer whose lookup has a frame one byte
/// over it gets no answer (it is disconnected at the frame header), while a lookup
/// whose frames are all within it is answered exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_server_max_frame_bytes_flag_sets_the_limit() {
    let dir = TempDir::new().expect("temp dir");
    let preload = dir.path().join("hashes.txt");
    std::fs::write(&preload, "0000000000000001\n0000000000000002\n").expect("write preload");
    // Above the ZMTP handshake's own READY command (about 40 bytes), which the limit
    // applies to as well: eight 8-byte hashes fit, nine do not.
    let limit = 64;
    let bin = env!("CARGO_BIN_EXE_lookup-server");
    let mut child = lookup_tests::KilledOnDrop(
        Command::new(bin)
            .args(["--bind", "tcp://127.0.0.1:0", "--block-size", "16"])
            .args(["--max-frame-bytes", &limit.to_string()])
            .arg("--preload")
            .arg(&preload)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run lookup-server"),
    );
    let endpoint: Endpoint = first_line(&mut child)
        .await
        .trim_end()
        .parse()
        .expect("an endpoint");
    let ctx = tmq::Context::new();
    let mut over = DealerClient::connect(&ctx, &endpoint);
    let big = lookup(TB, 160, B, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(big.iter().map(|f| f.len()).max(), Some(limit + 8));
    over.send_id(1, &big).await;
    // Not an assertion on time: a frame over the limit is never answered; the wait
    // only bounds how long the test looks for a reply.
    assert_eq!(over.recv_within(Duration::from_millis(300)).await, None);
    let mut req = Req::connect(&ctx, &endpoint);
    assert_eq!(good_lookup(&mut req).await, 32);
    drop(child);
}
