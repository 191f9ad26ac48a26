//! The reference `LookupServer` answers concurrently: a slow index call does not hold
//! up other requests, replies go out in completion order, and `max_concurrency`
//! bounds the calls in flight. Asserted on order and counts, never on wall time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lookup_core::wire::Format;
use lookup_server::{BlockIndex, DelayedIndex, InMemoryIndex, KeyLayout, ServerConfig};
use lookup_tests::server::{
    BarrierIndex, DealerClient, GateIndex, Req, Transport, hit, key, lookup, start_with, store,
};

const B: u32 = 16;
const TB: Format = Format::TaggedBlob;

/// Every one of `N` index calls waits until all `N` are waiting: only a server with
/// `N` lookups in flight at once can answer any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_in_flight_together_from_one_dealer() {
    const N: u64 = 16;
    let layout = KeyLayout::new("m");
    let index = Arc::new(BarrierIndex::new(usize::try_from(N).unwrap()));
    store(&index.inner, &layout, &[1, 2, 3]);
    let (server, _dir) = start_with(Transport::Ipc, ServerConfig::new(B, layout), index.clone());
    let mut dealer = DealerClient::connect(&tmq::Context::new(), server.local_endpoint());

    for id in 0..N {
        // Request `id` asks about a chain whose first `id % 4` blocks are stored.
        let chain: Vec<u64> = match id % 4 {
            0 => vec![9, 1, 2, 3],
            1 => vec![1, 9, 2, 3],
            2 => vec![1, 2, 9, 3],
            _ => vec![1, 2, 3, 9],
        };
        dealer.send_id(id, &lookup(TB, 65, B, &chain)).await;
    }
    let mut answers = BTreeMap::new();
    for _ in 0..N {
        let (id, reply) = dealer.recv_id().await;
        assert!(
            answers.insert(id, hit(TB, &reply)).is_none(),
            "two replies to rpc {id}"
        );
    }
    let expected: BTreeMap<u64, u32> = (0..N)
        .map(|id| (id, 16 * u32::try_from(id % 4).unwrap()))
        .collect();
    assert_eq!(answers, expected);
    assert_eq!(server.stats().replies, N);
    server.shutdown().await;
}

/// Same, with `N` separate REQ clients (vLLM's socket type), over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_in_flight_together_from_many_req_clients() {
    const N: usize = 8;
    let layout = KeyLayout::new("m");
    let index = Arc::new(BarrierIndex::new(N));
    store(&index.inner, &layout, &[1, 2]);
    let (server, _dir) = start_with(Transport::Tcp, ServerConfig::new(B, layout), index.clone());
    let ctx = tmq::Context::new();
    let mut tasks = Vec::new();
    for n in 0..N {
        let mut req = Req::connect(&ctx, server.local_endpoint());
        tasks.push(tokio::spawn(async move {
            let tokens = 33 + u32::try_from(n).unwrap();
            hit(TB, &req.call(&lookup(TB, tokens, B, &[1, 2])).await)
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 32);
    }
    server.shutdown().await;
}

/// A lookup stuck in the index does not block a later one: the later reply comes
/// first, and the stuck one is answered once its call returns.
#[tokio::test]
async fn a_slow_call_does_not_block_later_requests() {
    let layout = KeyLayout::new("m");
    let index = Arc::new(GateIndex::new(key(&layout, 0, 666)));
    store(&index.inner, &layout, &[1, 2, 666]);
    let (server, _dir) = start_with(Transport::Ipc, ServerConfig::new(B, layout), index.clone());
    let mut dealer = DealerClient::connect(&tmq::Context::new(), server.local_endpoint());

    dealer.send_id(1, &lookup(TB, 33, B, &[666, 9])).await;
    index.gated_arrived.notified().await;
    dealer.send_id(2, &lookup(TB, 33, B, &[1, 2])).await;
    let (id, reply) = dealer.recv_id().await;
    assert_eq!((id, hit(TB, &reply)), (2, 32));

    index.open();
    let (id, reply) = dealer.recv_id().await;
    assert_eq!((id, hit(TB, &reply)), (1, 16));
    assert_eq!(index.gated_calls.load(Ordering::SeqCst), 1);
    server.shutdown().await;
}

/// With `max_concurrency` 1 the server reads the next request only after the
/// current one is answered: replies come in request order.
#[tokio::test]
async fn max_concurrency_one_answers_in_turn() {
    let layout = KeyLayout::new("m");
    let index = Arc::new(GateIndex::new(key(&layout, 0, 666)));
    store(&index.inner, &layout, &[1, 2, 666]);
    let mut config = ServerConfig::new(B, layout);
    config.max_concurrency = 1;
    let (server, _dir) = start_with(Transport::Ipc, config, index.clone());
    let mut dealer = DealerClient::connect(&tmq::Context::new(), server.local_endpoint());

    dealer.send_id(1, &lookup(TB, 33, B, &[666, 9])).await;
    index.gated_arrived.notified().await;
    dealer.send_id(2, &lookup(TB, 33, B, &[1, 2])).await;
    // Not an assertion on time: request 2 must never be answered while 1 is held;
    // the wait only bounds how long the test looks for a wrong reply.
    assert_eq!(dealer.recv_within(Duration::from_millis(200)).await, None);
    assert_eq!(server.stats().requests, 1);

    index.open();
    let (first, reply) = dealer.recv_id().await;
    assert_eq!((first, hit(TB, &reply)), (1, 16));
    let (second, reply) = dealer.recv_id().await;
    assert_eq!((second, hit(TB, &reply)), (2, 32));
    server.shutdown().await;
}

/// `max_pending_bytes`: once the requests held unanswered reach the cap, the server
/// reads nothing more until one is answered (like `max_concurrency`); a request held
/// counts its frames as received (ZeroMQ's 5-byte routing id, the envelope, the
/// delimiter, the body) and the store keys it builds.
#[tokio::test]
async fn max_pending_bytes_stops_reading_until_a_reply_goes_out() {
    let layout = KeyLayout::new("m");
    let index = Arc::new(GateIndex::new(key(&layout, 0, 666)));
    store(&index.inner, &layout, &[1, 2, 666]);
    let mut config = ServerConfig::new(B, layout.clone());
    config.max_pending_bytes = 1;
    let (server, _dir) = start_with(Transport::Ipc, config, index.clone());
    let mut dealer = DealerClient::connect(&tmq::Context::new(), server.local_endpoint());

    let held = lookup(TB, 33, B, &[666, 9]);
    dealer.send_id(1, &held).await;
    index.gated_arrived.notified().await;
    dealer.send_id(2, &lookup(TB, 33, B, &[1, 2])).await;
    // Not an assertion on time: request 2 must never be read while 1 is held; the
    // wait only bounds how long the test looks for a wrong reply.
    assert_eq!(dealer.recv_within(Duration::from_millis(200)).await, None);
    let stats = server.stats();
    assert_eq!((stats.requests, stats.input_pauses), (1, 1));
    let body: usize = held.iter().map(|f| f.len()).sum();
    let key_len = key(&layout, 0, 666).len() + size_of::<String>();
    assert_eq!(
        stats.pending_bytes_peak,
        (5 + 8 + body + 2 * key_len) as u64
    );

    index.open();
    let (first, reply) = dealer.recv_id().await;
    assert_eq!((first, hit(TB, &reply)), (1, 16));
    let (second, reply) = dealer.recv_id().await;
    assert_eq!((second, hit(TB, &reply)), (2, 32));
    assert_eq!(server.stats().requests, 2);
    server.shutdown().await;
}

/// A 50 ms index and 64 DEALER requests in flight: every one is answered once, with
/// the right hit, and the index was asked once per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_index_many_requests_all_answered() {
    const N: u64 = 64;
    let layout = KeyLayout::new("m");
    let memory = Arc::new(InMemoryIndex::new());
    store(&memory, &layout, &[1, 2, 3, 4]);
    let index: Arc<dyn BlockIndex> = Arc::new(DelayedIndex::new(memory, Duration::from_millis(50)));
    let (server, _dir) = start_with(Transport::Tcp, ServerConfig::new(B, layout), index);
    let mut dealer = DealerClient::connect(&tmq::Context::new(), server.local_endpoint());

    for id in 0..N {
        let blocks = usize::try_from(id % 4).unwrap() + 1;
        let chain = &[1, 2, 3, 4][..blocks];
        dealer
            .send_id(
                id,
                &lookup(TB, 16 * u32::try_from(blocks).unwrap() + 1, B, chain),
            )
            .await;
    }
    let mut seen = BTreeMap::new();
    for _ in 0..N {
        let (id, reply) = dealer.recv_id().await;
        assert!(
            seen.insert(id, hit(TB, &reply)).is_none(),
            "two replies to rpc {id}"
        );
    }
    let expected: BTreeMap<u64, u32> = (0..N)
        .map(|id| (id, 16 * (u32::try_from(id % 4).unwrap() + 1)))
        .collect();
    assert_eq!(seen, expected);
    let stats = server.stats();
    assert_eq!(stats.lookups, N);
    assert_eq!(stats.keys_checked, (1 + 2 + 3 + 4) * N / 4);
    server.shutdown().await;
}
