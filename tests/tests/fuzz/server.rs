//! Fuzzing the reference server's whole request path (RELIABILITY.md): 100,000
//! arbitrary multipart messages (any envelope, delimiter or none, requests of either
//! format structured, mutated or arbitrary, resets, junk) sent over ipc to a real
//! `LookupServer` in 2,000 batches of 50, each batch followed by a valid lookup that
//! must be answered with its exact hit. Afterwards the server's counters balance:
//! every message that had a delimiter got exactly one reply, and those without one
//! were dropped and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::wire::{self, Format};
use lookup_tests::fault::{B, ChainIndex, TempDir, chain, chain_server, expected_hit, num_tokens};
use lookup_tests::fuzz::{any_frames, any_request, bytes, config};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};

/// Batches sent, each ended by a probe round trip.
const CASES: u32 = 2_000;
/// Arbitrary messages per batch.
const BATCH: usize = 50;
/// Longest wait for the probe's reply.
const REPLY_DEADLINE: Duration = Duration::from_secs(10);
/// First envelope byte of the probes: no generated envelope is 8 bytes starting so
/// and also followed by the delimiter and a 4-byte reply by chance.
const PROBE_TAG: u64 = 0xf1f2_f3f4_0000_0000;

/// A whole message as a DEALER sends it: an envelope then a delimiter then a request
/// (what a client sends), or any frames at all.
fn any_message() -> impl Strategy<Value = Vec<Bytes>> {
    prop_oneof![
        3 => (prop::collection::vec(bytes(12).prop_filter("envelope frames are never empty", |f| !f.is_empty()), 0..=2), any_request())
            .prop_map(|(mut envelope, request)| {
                envelope.push(Bytes::new());
                envelope.extend(request);
                envelope
            }),
        1 => any_frames().prop_filter("ZeroMQ sends at least one frame", |f| !f.is_empty()),
    ]
}

#[test]
fn server_keeps_answering_whatever_it_is_sent() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = TempDir::new("fuzz-server");
    let endpoint = dir.ipc("lookup.sock");
    let index = Arc::new(ChainIndex::new());
    let (server, dealer) = runtime.block_on(async {
        let server = chain_server(&endpoint, Arc::clone(&index));
        let dealer = tmq::dealer(&tmq::Context::new())
            .set_linger(0)
            .connect(&endpoint.url())
            .expect("dealer");
        (server, dealer)
    });
    let dealer = std::sync::Mutex::new(dealer);
    let config = config(CASES);
    let seed = config.rng_seed;
    let started = Instant::now();
    let case = AtomicU64::new(0);
    let batch = prop::collection::vec(any_message(), BATCH);
    let result = TestRunner::new(config).run(&batch, |messages| {
        let n = case.fetch_add(1, Ordering::Relaxed) + 1;
        let probe_id = PROBE_TAG | n;
        let id = n % 1_000;
        let mut dealer = dealer.lock().expect("lock");
        runtime.block_on(async {
            for message in &messages {
                let junk: Vec<tmq::Message> =
                    message.iter().map(|f| tmq::Message::from(&f[..])).collect();
                dealer
                    .send(junk)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("send: {e}")))?;
            }
            let lookup = wire::encode_lookup(Format::TaggedBlob, num_tokens(id), B, &chain(id));
            let mut probe = vec![
                tmq::Message::from(&probe_id.to_be_bytes()[..]),
                tmq::Message::new(),
            ];
            probe.extend(lookup.iter().map(|f| tmq::Message::from(&f[..])));
            dealer
                .send(probe)
                .await
                .map_err(|e| TestCaseError::fail(format!("send: {e}")))?;
            // Replies to the junk, if any, come first (same connection, in order).
            let deadline = tokio::time::Instant::now() + REPLY_DEADLINE;
            loop {
                let reply = tokio::time::timeout_at(deadline, dealer.next())
                    .await
                    .map_err(|_| TestCaseError::fail("the server stopped answering"))?
                    .ok_or_else(|| TestCaseError::fail("the socket closed"))?
                    .map_err(|e| TestCaseError::fail(format!("recv: {e}")))?;
                let frames: Vec<Bytes> = reply
                    .into_iter()
                    .map(|m| Bytes::copy_from_slice(&m))
                    .collect();
                if frames.len() == 3
                    && frames[0].as_ref() == probe_id.to_be_bytes()
                    && frames[1].is_empty()
                {
                    let hit = wire::decode_lookup_reply(Format::TaggedBlob, &frames[2..])
                        .map_err(|e| TestCaseError::fail(format!("probe reply: {e}")))?;
                    prop_assert_eq!(hit.hit_tokens, expected_hit(id));
                    return Ok(());
                }
            }
        })
    });
    if let Err(error) = result {
        panic!("{error} (seed {seed})");
    }
    let stats = server.stats();
    eprintln!(
        "[server request path] {} messages and {CASES} probes in {:?}: {stats:?}",
        CASES as usize * BATCH,
        started.elapsed()
    );
    assert_eq!(stats.requests, u64::from(CASES) * (BATCH as u64 + 1));
    assert_eq!(
        stats.replies + stats.no_delimiter,
        stats.requests,
        "{stats:?}"
    );
    assert!(stats.lookups >= u64::from(CASES));
    assert!(stats.decode_errors > 0 && stats.unknown_tags > 0 && stats.no_delimiter > 0);
    assert_eq!((stats.index_errors, stats.socket_errors), (0, 0));
    drop(dealer);
    runtime.block_on(server.shutdown());
    assert_eq!(dir.entries(), Vec::<String>::new());
}
