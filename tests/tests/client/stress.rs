//! `LookupClient` against the reference `LookupServer` under load: many clients at
//! once, and a server stopped and restarted in the middle of a run (rule 17: a
//! server that is down or restarted costs lookups, never a hang).

use lookup_tokio::Deadline;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lookup_core::{BlockHashes, Probe, Request, RequestId};
use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
use lookup_tests::client::{TempDir, free_tcp, reference_hit};
use lookup_tokio::{ClientConfig, Endpoint, KeyLayout, LookupClient};

const B: u32 = 16;
const LIMIT: Duration = Duration::from_secs(40);

/// One prompt of the workload: its request and the hit the server must answer.
struct Case {
    req: Request,
    hit: u32,
}

/// splitmix64: a fixed, seedable stream for hash chains (no state beyond a u64).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Request `id` of the workload, with a chained hash per block (each hash covers its
/// parent, as in vLLM), and the first `present` blocks put in `index`.
fn case(id: u64, index: &InMemoryIndex, layout: &KeyLayout) -> Case {
    let r = mix(id);
    let blocks = 1 + (r % 8) as u32;
    let num_tokens = blocks * B + (r >> 8) as u32 % B;
    let mut parent = id;
    let ids: Vec<u64> = (0..blocks)
        .map(|_| {
            parent = mix(parent);
            parent
        })
        .collect();
    let block_hashes = BlockHashes::from_u64s(&ids);
    let present = ((r >> 16) % u64::from(blocks + 1)) as usize;
    index.insert_chain(layout, &block_hashes, present);
    let hit = reference_hit(num_tokens, B, &block_hashes, &|h| {
        ids.iter().take(present).any(|id| id.to_be_bytes() == h)
    });
    Case {
        req: Request {
            request_id: RequestId(id),
            num_tokens,
            block_hashes,
            skip_reading_external_kv: false,
        },
        hit,
    }
}

fn ready(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

fn server(endpoint: &Endpoint, index: &Arc<InMemoryIndex>, layout: &KeyLayout) -> LookupServer {
    let index: Arc<InMemoryIndex> = Arc::clone(index);
    LookupServer::bind(endpoint, ServerConfig::new(B, layout.clone()), index)
        .expect("bind the server")
}

/// Probes until `Ready` (async mode), sleeping on the client's reports in between.
async fn probe_ready(client: &mut LookupClient, req: &Request) -> Probe {
    let deadline = Instant::now() + LIMIT;
    loop {
        match client.probe(req, 0) {
            Probe::Pending => {
                assert!(
                    Instant::now() < deadline,
                    "request {} never became ready",
                    req.request_id
                );
                client.wait_progress(Duration::from_millis(50)).await;
            }
            answer => return answer,
        }
    }
}

/// Every RPC the client created has ended exactly once.
fn assert_all_rpcs_ended(client: &mut LookupClient) {
    let stats = client.stats();
    let core = &stats.core;
    assert_eq!(stats.open_rpcs, 0);
    assert_eq!(stats.slots_in_use, 0);
    assert_eq!(
        core.hits
            + core.misses
            + core.failed_malformed
            + core.failed_timed_out
            + core.failed_transport
            + core.rpcs_cancelled,
        core.rpcs_created,
        "{core:?}"
    );
}

/// 10 clients, 1,000 lookups each, against one server over tcp: every answer equals
/// the reference. Even clients use sync mode (`probe_wait`, vLLM's default); odd
/// ones async mode with prefetch and 4 RPCs on the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_clients_thousand_lookups_each() {
    const CLIENTS: u64 = 10;
    const LOOKUPS: u64 = 1_000;
    let endpoint = free_tcp();
    let layout = KeyLayout::default();
    let index = Arc::new(InMemoryIndex::new());
    let cases: Vec<Vec<Case>> = (0..CLIENTS)
        .map(|c| {
            (0..LOOKUPS)
                .map(|j| case(c * LOOKUPS + j, &index, &layout))
                .collect()
        })
        .collect();
    // A prompt of exactly one block can load nothing (rule 12): answered without RPC.
    let needs_rpc = cases
        .iter()
        .flatten()
        .filter(|c| c.req.num_tokens > B)
        .count() as u64;
    assert!(needs_rpc > 9_000, "workload too easy: {needs_rpc}");
    let server = server(&endpoint, &index, &layout);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, cases) in cases.into_iter().enumerate() {
        let mut config = ClientConfig::zmq(endpoint.clone(), B);
        let sync = c % 2 == 0;
        if !sync {
            config.core.lookup_async = true;
            config.core.lookup_prefetch_limit = 16;
            config.core.max_in_flight = 4;
        }
        let mut client = LookupClient::connect_lazy(config).expect("connect");
        tasks.push(tokio::spawn(async move {
            let mut wrong = 0;
            if sync {
                for case in &cases {
                    if client.probe_until(&case.req, 0, Deadline::Answer).await != ready(case.hit) {
                        wrong += 1;
                    }
                    client.on_allocated(case.req.request_id);
                    client.on_finished(case.req.request_id);
                }
            } else {
                for batch in cases.chunks(25) {
                    for case in batch {
                        client.on_new_request(&case.req);
                    }
                    for case in batch {
                        if probe_ready(&mut client, &case.req).await != ready(case.hit) {
                            wrong += 1;
                        }
                        client.on_allocated(case.req.request_id);
                        client.on_finished(case.req.request_id);
                    }
                }
            }
            assert_all_rpcs_ended(&mut client);
            let stats = client.stats();
            client.close();
            (wrong, stats)
        }));
    }
    let mut lookups = 0;
    for task in tasks {
        let (wrong, stats) = tokio::time::timeout(LIMIT, task)
            .await
            .expect("no hang")
            .expect("client task");
        assert_eq!(wrong, 0, "{stats:?}");
        assert_eq!(
            stats.core.failed_timed_out + stats.core.failed_transport + stats.core.failed_malformed,
            0
        );
        lookups += stats.rpcs_sent;
    }
    let elapsed = started.elapsed();
    eprintln!("{} lookups by {CLIENTS} clients in {elapsed:?}", lookups);
    // Identical prompts never occur in this workload, so every lookup is one RPC; the
    // prefetching clients also look up one-block prompts (rule 1 admits them).
    assert!(lookups >= needs_rpc, "{lookups} < {needs_rpc}");
    assert_eq!(server.stats().lookups, lookups);
    server.shutdown().await;
}

/// A server stopped after 300 of 1,000 requests and started again on the same ipc
/// endpoint once the client has gone on without it for 20 requests: no hang, every request ends, no
/// answer is ever wrong (a lost lookup is 0 hits), no slot leaks, every RPC ends, and
/// the lookups after the restart are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_mid_run() {
    const REQUESTS: u64 = 1_000;
    const BATCH: usize = 20;
    const OUTAGE_START: usize = 300;
    const OUTAGE_END: usize = 320;
    let dir = TempDir::new("restart");
    let endpoint = dir.ipc("lookup.sock");
    let layout = KeyLayout::default();
    let index = Arc::new(InMemoryIndex::new());
    let cases: Vec<Case> = (0..REQUESTS)
        .map(|j| case(50_000 + j, &index, &layout))
        .collect();
    let first = server(&endpoint, &index, &layout);
    let mut config = ClientConfig::zmq(endpoint.clone(), B);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 8;
    config.core.max_in_flight = 4;
    config.core.lookup_timeout = Duration::from_millis(300);
    config
        .transport
        .zmq_mut()
        .expect("zmq")
        .reopen_after_timeouts = 3;
    let mut client = LookupClient::connect_lazy(config).expect("connect");

    // Like a scheduler step loop: each step probes every waiting request of the batch
    // once, and finishes those that are ready. The server goes down right after the
    // arrivals of request 300's batch (prefetches on the wire), and a new one comes up
    // on the same endpoint once that batch has ended without it.
    let mut first = Some(first);
    let mut second = None;
    let run = async {
        let mut answers: Vec<Option<Probe>> = vec![None; cases.len()];
        for (b, batch) in cases.chunks(BATCH).enumerate() {
            if b * BATCH == OUTAGE_END {
                second = Some(server(&endpoint, &index, &layout));
            }
            for case in batch {
                client.on_new_request(&case.req);
            }
            if b * BATCH == OUTAGE_START {
                first.take().expect("first server").shutdown().await;
            }
            let mut waiting = batch.len();
            while waiting > 0 {
                for (i, case) in batch.iter().enumerate() {
                    let slot = &mut answers[b * BATCH + i];
                    if slot.is_some() {
                        continue;
                    }
                    let answer = client.probe(&case.req, 0);
                    if answer != Probe::Pending {
                        *slot = Some(answer);
                        client.on_allocated(case.req.request_id);
                        client.on_finished(case.req.request_id);
                        waiting -= 1;
                    }
                }
                if waiting > 0 {
                    client.wait_progress(Duration::from_millis(50)).await;
                }
            }
        }
        answers
            .into_iter()
            .map(|a| a.expect("answered"))
            .collect::<Vec<Probe>>()
    };
    let answers = tokio::time::timeout(LIMIT, run).await.expect("no hang");
    let second = second.expect("second server");

    assert_eq!(answers.len(), cases.len());
    let mut lost = 0;
    for (i, (answer, case)) in answers.iter().zip(&cases).enumerate() {
        if *answer == ready(case.hit) {
            continue;
        }
        assert_eq!(*answer, ready(0), "request {i}: a wrong answer");
        lost += 1;
        // Only lookups around the outage may be lost.
        assert!(
            (OUTAGE_START..OUTAGE_END + 100).contains(&i),
            "request {i} lost outside the outage"
        );
    }
    // Let the RPCs of finished requests still on the wire end, then check the books.
    let deadline = Instant::now() + LIMIT;
    while client.stats().open_rpcs > 0 {
        assert!(Instant::now() < deadline, "RPCs never ended");
        client.wait_progress(Duration::from_millis(20)).await;
    }
    assert_all_rpcs_ended(&mut client);
    let stats = client.stats();
    eprintln!("lost {lost} lookups around the restart; {stats:?}");
    assert!(
        stats.core.failed_timed_out + stats.core.failed_transport > 0,
        "the outage cost no lookup: {stats:?}"
    );
    assert!(second.stats().lookups > 0);
    client.close();
    second.shutdown().await;
    assert_eq!(dir.entries(), Vec::<String>::new());
}
