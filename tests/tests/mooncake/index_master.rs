//! `MooncakeIndex` behind a real `LookupServer`, against the real `mooncake_master`
//! (PyPI 0.3.13.post1) with blocks written by the real Python store client
//! (`mooncake_peers::writer_script`) under exactly the keys of the server's `KeyLayout`
//! (`spec/wire.md`, "What the server computes"). Clients are REQ and DEALER sockets
//! written with tmq directly and our `LookupClient` (the `lookup-server` program's
//! `--mooncake-master` is tested with the program, in `lookup-cli`).
//! Needs `scripts/mooncake/install.sh`.

use lookup_tokio::Deadline;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lookup_core::wire::{self, Format};
use lookup_core::{Answer, BlockHashes, Probe, Request, RequestId, Unavailable};
use lookup_server::{LookupServer, MooncakeIndex, ServerConfig};
use lookup_tests::mooncake::{Master, Writer};
use lookup_tests::server::{DealerClient, Req, hit, lookup, store_unavailable};
use lookup_tokio::mooncake_master::{BatchConfig, MasterConfig};
use lookup_tokio::{ClientConfig, Endpoint, KeyLayout, LookupClient, RankNamespace};
use tempfile::TempDir;

/// Block size in tokens (vLLM's default).
const B: u32 = 16;
const MODEL: &str = "Qwen/Qwen3-8B";
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

/// A real master and Python writer, and a `LookupServer` bound on ipc that answers
/// from a `MooncakeIndex` on that master.
struct Stack {
    master: Master,
    writer: Writer,
    index: Arc<MooncakeIndex>,
    server: LookupServer,
    layout: KeyLayout,
    ctx: tmq::Context,
    /// Holds the ipc socket file; outlives the server.
    _dir: TempDir,
}

impl Stack {
    async fn start(layout: KeyLayout, chunk_keys: usize) -> Self {
        let master = Master::start();
        let writer = Writer::start(&master);
        let mut config = MasterConfig::default();
        config.chunk_keys = chunk_keys;
        // No presence cache: these tests count the master's calls and keys.
        let index = Arc::new(
            MooncakeIndex::connect(&master.addr(), config)
                .await
                .expect("connect the index to the master")
                .with_batching(BatchConfig::uncached())
                .expect("batching"),
        );
        let dir = TempDir::new().expect("temp dir");
        let endpoint = Endpoint::Ipc(dir.path().join("lookup.sock"));
        let server = LookupServer::bind(
            &endpoint,
            ServerConfig::new(B, layout.clone()),
            index.clone(),
        )
        .expect("bind");
        Self {
            master,
            writer,
            index,
            server,
            layout,
            ctx: tmq::Context::new(),
            _dir: dir,
        }
    }

    /// Stores blocks `ids` in every namespace with the Python client.
    fn put_blocks(&mut self, ids: &[u64]) {
        let keys = keys_of(&self.layout, ids);
        self.writer.put(&keys);
    }

    fn req(&self) -> Req {
        Req::connect(&self.ctx, self.server.local_endpoint())
    }

    fn dealer(&self) -> DealerClient {
        DealerClient::connect(&self.ctx, self.server.local_endpoint())
    }
}

/// `n` chained block ids starting at `first`.
fn chain(first: u64, n: u64) -> Vec<u64> {
    (first..first + n).collect()
}

#[tokio::test]
async fn mooncake_master_chain_with_blocks_1_to_3_of_5_hits_3_blocks() {
    let mut stack = Stack::start(layout(1), 1024).await;
    let ids = chain(101, 5);
    // Blocks 1-3 and 5: the run still ends at the missing fourth.
    stack.put_blocks(&ids[..3]);
    stack.put_blocks(&ids[4..]);
    let keys = keys_of(&stack.layout, &ids);
    assert_eq!(
        keys[0],
        "vllm@Qwen/Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0000000000000065"
    );
    assert_eq!(stack.writer.exist(&keys), [1, 1, 1, 0, 1]);

    // 87 tokens: 5 full blocks asked, 3 present → 48 hit tokens.
    let mut req = stack.req();
    assert_eq!(hit(TB, &req.call(&lookup(TB, 87, B, &ids)).await), 48);
    // msgpack-hex: the client floors the token count to 80 first.
    assert_eq!(hit(MP, &req.call(&lookup(MP, 87, B, &ids)).await), 48);
    // 40 tokens: only 2 blocks are asked, both present, 32 < 40.
    assert_eq!(hit(TB, &req.call(&lookup(TB, 40, B, &ids)).await), 32);

    // A DEALER client with several lookups in flight at once.
    let mut dealer = stack.dealer();
    for rpc_id in 1..=4u64 {
        dealer.send_id(rpc_id, &lookup(TB, 87, B, &ids)).await;
    }
    let mut answered = Vec::new();
    for _ in 1..=4 {
        let (rpc_id, reply) = dealer.recv_id().await;
        answered.push((rpc_id, hit(TB, &reply)));
    }
    answered.sort_unstable();
    assert_eq!(answered, [(1, 48), (2, 48), (3, 48), (4, 48)]);

    let server = stack.server.stats();
    assert_eq!(server.lookups, 7);
    assert_eq!(server.index_errors, 0);
    assert_eq!(server.hit_tokens, 6 * 48 + 32);
    let index = stack.index.stats();
    assert_eq!(index.lookups, 7);
    assert_eq!(index.blocks_found, 6 * 3 + 2);
    assert_eq!((index.errors, index.key_errors), (0, 0));
    // One BatchExistKey call per batch, every asked key in it once: the three
    // lookups asked one at a time get a call each; the DEALER's four in flight at once
    // share calls (each asks the same 5 keys), so 4 to 7 calls, 5 keys each but the
    // 40-token lookup's 2.
    let calls = index.master.batch_exist_calls;
    assert!((4..=7).contains(&calls), "{calls} calls");
    assert_eq!(index.master.keys_asked, 5 * (calls - 1) + 2);
    assert_eq!((index.batch.lookups, index.batch.batches), (7, calls));
    assert_eq!(index.master.connects, 1);
}

#[tokio::test]
async fn mooncake_master_two_rank_namespaces_one_missing_key_breaks_the_run() {
    let mut stack = Stack::start(layout(2), 1024).await;
    let ids = chain(201, 5);
    let keys = keys_of(&stack.layout, &ids);
    // Every key but tp_rank 1's of the third block (keys are block-major).
    let missing = keys[2 * 2 + 1].clone();
    assert_eq!(
        missing,
        "vllm@Qwen/Qwen3-8B@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@00000000000000cb"
    );
    let stored: Vec<&String> = keys.iter().filter(|k| **k != missing).collect();
    stack.writer.put(&stored);
    let python = stack.writer.exist(&keys);
    assert_eq!(python, [1, 1, 1, 1, 1, 0, 1, 1, 1, 1]);

    let mut req = stack.req();
    // Namespace 0 alone would run to the end; the block needs both.
    assert_eq!(hit(TB, &req.call(&lookup(TB, 81, B, &ids)).await), 32);

    // Once the missing shard is written, the whole chain is present (80 < 81 tokens:
    // no full-hit trim).
    stack.writer.put(&[missing]);
    assert_eq!(hit(TB, &req.call(&lookup(TB, 81, B, &ids)).await), 80);

    let index = stack.index.stats();
    assert_eq!(index.lookups, 2);
    assert_eq!(index.blocks_found, 2 + 5);
    assert_eq!(index.master.batch_exist_calls, 2);
    assert_eq!(index.master.keys_asked, 20);
    assert_eq!(stack.server.stats().keys_checked, 20);
}

#[tokio::test]
async fn mooncake_master_full_hit_recomputes_the_last_token() {
    let mut stack = Stack::start(layout(1), 1024).await;
    let ids = chain(301, 3);
    stack.put_blocks(&ids);
    let mut req = stack.req();
    // spec/wire.md step 4: a hit covering the whole prompt recomputes the last token.
    for (num_tokens, expected) in [(48, 32), (49, 48), (47, 32), (32, 16), (16, 0)] {
        let reply = req.call(&lookup(TB, num_tokens, B, &ids)).await;
        assert_eq!(hit(TB, &reply), expected, "{num_tokens} tokens");
    }
    assert_eq!(hit(MP, &req.call(&lookup(MP, 48, B, &ids)).await), 32);
    let index = stack.index.stats();
    assert_eq!(index.lookups, 6);
    assert_eq!(index.blocks_found, 3 + 3 + 2 + 2 + 1 + 3);
}

#[tokio::test]
async fn mooncake_master_long_chain_stops_after_the_call_that_ends_the_run() {
    // Chunks of 8 keys: 4 blocks of 2 namespaces per BatchExistKey call.
    let mut stack = Stack::start(layout(2), 8).await;
    let ids = chain(401, 40);
    let keys = keys_of(&stack.layout, &ids);
    // Block 9's tp_rank 1 key is missing.
    let missing = keys[9 * 2 + 1].clone();
    let stored: Vec<&String> = keys.iter().filter(|k| **k != missing).collect();
    stack.writer.put(&stored);

    let mut req = stack.req();
    assert_eq!(
        hit(TB, &req.call(&lookup(TB, 40 * B + 1, B, &ids)).await),
        9 * B
    );
    let index = stack.index.stats();
    // Calls for blocks 0-3, 4-7 and 8-11; blocks 12-39 never asked (no leases).
    assert_eq!(index.master.batch_exist_calls, 3);
    assert_eq!(index.master.keys_asked, 24);
    // Bug e: the server counted the chain's 80 keys; it counts the 24 asked.
    assert_eq!(stack.server.stats().keys_checked, 24);
    // The reference client agrees on where the run ends.
    let python = stack.writer.exist(&keys);
    assert_eq!(python.iter().take_while(|&&r| r == 1).count(), 19);
}

#[tokio::test]
async fn mooncake_master_reset_answers_failed_and_removes_nothing() {
    let mut stack = Stack::start(layout(1), 1024).await;
    let ids = chain(501, 3);
    stack.put_blocks(&ids);
    let mut req = stack.req();
    assert_eq!(hit(TB, &req.call(&lookup(TB, 49, B, &ids)).await), 48);
    let reply = req.call(&wire::encode_reset(TB).unwrap()).await;
    assert_eq!(wire::decode_reset_reply(&reply), Ok(false));
    // Every block is still stored.
    assert_eq!(hit(TB, &req.call(&lookup(TB, 49, B, &ids)).await), 48);
    let server = stack.server.stats();
    assert_eq!((server.resets, server.reset_failures), (1, 1));
    assert_eq!(stack.index.stats().resets_refused, 1);
    assert_eq!(stack.writer.exist(&keys_of(&stack.layout, &ids)), [1, 1, 1]);
}

/// `spec/wire.md`, "Store unavailable": while the master is down every lookup gets the
/// error reply (the single byte `0x00`, in both formats), never a 4-byte miss.
#[tokio::test]
async fn mooncake_master_stopped_answers_store_unavailable_without_hanging_and_recovers_after_restart()
 {
    let mut stack = Stack::start(layout(1), 1024).await;
    let port = stack.master.rpc_port();
    let ids = chain(601, 5);
    stack.put_blocks(&ids[..3]);
    let mut dealer = stack.dealer();
    dealer.send_id(0, &lookup(TB, 87, B, &ids)).await;
    assert_eq!(hit(TB, &dealer.recv_id().await.1), 48);

    stack.master.stop();
    // Lookups while the master is down: every one gets the store-unavailable reply,
    // none waits for the call timeout (1 s): a dead master fails fast.
    let started = Instant::now();
    for rpc_id in 1..=20u64 {
        let format = if rpc_id == 20 { MP } else { TB };
        dealer.send_id(rpc_id, &lookup(format, 87, B, &ids)).await;
        let (got, reply) = dealer.recv_id().await;
        assert_eq!((got, reply[0].as_ref()), (rpc_id, &[0x00][..]));
        assert!(store_unavailable(format, &reply), "{format}");
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < MasterConfig::default().call_timeout,
        "20 lookups against a dead master took {elapsed:?}"
    );
    assert_eq!(stack.server.stats().index_errors, 20);
    let index = stack.index.stats();
    assert_eq!((index.errors, index.unavailable), (20, 20));
    assert_eq!(index.master.timeouts, 0);

    // The same port again; the new master starts empty, so the blocks are written
    // again by a new writer (the old one's store client died with the old master).
    let restarted = Master::start_on(port);
    stack.writer = Writer::start(&restarted);
    stack.put_blocks(&ids[..3]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rpc_id = 100;
    let recovered = loop {
        rpc_id += 1;
        dealer.send_id(rpc_id, &lookup(TB, 87, B, &ids)).await;
        let (got, reply) = dealer.recv_id().await;
        assert_eq!(got, rpc_id);
        // Until the new master answers, the store is unavailable.
        let hit = if store_unavailable(TB, &reply) {
            0
        } else {
            hit(TB, &reply)
        };
        if hit != 0 || Instant::now() >= deadline {
            break hit;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(recovered, 48, "no recovery within 10 s of the restart");
    let server = stack.server.stats();
    let index = stack.index.stats();
    // Every failure the server counted is one the index counted, and vice versa.
    assert_eq!(server.index_errors, index.errors);
    // One reconnect at least: a freshly restarted master sometimes drops the first
    // connection it accepts, and the client then connects once more.
    assert!(index.master.connects >= 2, "{}", index.master.connects);
    assert!(index.master.connections_lost >= 1);
    stack.master = restarted;
}

/// Acceptance of `spec/wire.md`, "Store unavailable": with the master killed behind
/// the server, our client answers unavailable (`Unavailable::Store`, counted as a
/// failure, not a miss) within one call timeout of the master client (1 s), in sync
/// mode, and retries after the failure backoff as for any failure (rule 11).
#[tokio::test]
async fn mooncake_master_killed_behind_the_server_reads_as_unavailable_in_our_client() {
    let mut stack = Stack::start(layout(1), 1024).await;
    let ids = chain(801, 5);
    stack.put_blocks(&ids[..3]);
    let mut client =
        LookupClient::connect_lazy(ClientConfig::zmq(stack.server.local_endpoint().clone(), B))
            .expect("client");
    let req = |id: u64| Request {
        request_id: RequestId(id),
        num_tokens: 87,
        block_hashes: BlockHashes::from_u64s(&ids),
        skip_reading_external_kv: false,
    };
    assert_eq!(
        client.probe_until(&req(1), 0, Deadline::Answer).await,
        Probe::Ready {
            external_tokens: 48,
            load_async: true
        }
    );
    client.on_allocated(RequestId(1));

    stack.master.stop();
    let started = Instant::now();
    let probe = client.probe_until(&req(2), 0, Deadline::Answer).await;
    let took = started.elapsed();
    assert_eq!(
        (probe, client.answer_of(RequestId(2))),
        (
            Probe::Ready {
                external_tokens: 0,
                load_async: false
            },
            Some(Answer::Unavailable(Unavailable::Store))
        )
    );
    assert!(
        took < MasterConfig::default().call_timeout,
        "unavailable after {took:?}, above one call timeout"
    );
    // After the backoff the request asks again and fails the same way: a retry, not a
    // cached miss.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        client.probe_until(&req(2), 0, Deadline::Answer).await,
        Probe::Ready {
            external_tokens: 0,
            load_async: false
        }
    );
    let stats = client.stats();
    assert_eq!(
        (
            stats.core.hits,
            stats.core.misses,
            stats.core.failed_store_unavailable,
            stats.core.failed_malformed,
            stats.core.failed_transport,
            stats.core.retries_after_failure,
        ),
        (1, 0, 2, 0, 0, 1)
    );
    // The older format carries the same error reply, and reads the same way.
    let mut config = ClientConfig::zmq(stack.server.local_endpoint().clone(), B);
    config
        .transport
        .zmq_mut()
        .expect("a ZeroMQ transport")
        .format = Format::MsgpackHex;
    let mut older = LookupClient::connect_lazy(config).expect("msgpack-hex client");
    assert_eq!(
        (
            older.probe_until(&req(3), 0, Deadline::Answer).await,
            older.answer_of(RequestId(3))
        ),
        (
            Probe::Ready {
                external_tokens: 0,
                load_async: false
            },
            Some(Answer::Unavailable(Unavailable::Store))
        )
    );
    assert_eq!(older.stats().core.failed_store_unavailable, 1);
    assert_eq!(stack.server.stats().index_errors, 3);
    older.shutdown().await;
    client.shutdown().await;
}

#[tokio::test]
async fn mooncake_master_lookup_client_end_to_end() {
    let mut stack = Stack::start(layout(1), 1024).await;
    let ids = chain(701, 5);
    stack.put_blocks(&ids[..3]);
    let mut client =
        LookupClient::connect_lazy(ClientConfig::zmq(stack.server.local_endpoint().clone(), B))
            .expect("client");
    let req = Request {
        request_id: RequestId(1),
        num_tokens: 87,
        block_hashes: BlockHashes::from_u64s(&ids),
        skip_reading_external_kv: false,
    };
    // Sync mode (vLLM's default): the probe waits for the server, which asks the
    // master: 3 blocks of 16 tokens.
    assert_eq!(
        client.probe_until(&req, 0, Deadline::Answer).await,
        Probe::Ready {
            external_tokens: 48,
            load_async: true
        }
    );
    // The result is kept for the request (rule 5): a later probe with a local hit of
    // one block loads the other two, without another RPC.
    assert_eq!(
        client.probe_until(&req, 16, Deadline::Answer).await,
        Probe::Ready {
            external_tokens: 32,
            load_async: true
        }
    );
    client.on_allocated(req.request_id);
    assert_eq!(stack.server.stats().lookups, 1);
    assert_eq!(stack.index.stats().master.batch_exist_calls, 1);

    // Every block stored and an aligned prompt: the last block is recomputed.
    stack.put_blocks(&ids[3..]);
    let full = Request {
        request_id: RequestId(2),
        num_tokens: 80,
        ..req.clone()
    };
    assert_eq!(
        client.probe_until(&full, 0, Deadline::Answer).await,
        Probe::Ready {
            external_tokens: 64,
            load_async: true
        }
    );
    client.on_finished(full.request_id);
    client.shutdown().await;
    assert_eq!(stack.server.stats().index_errors, 0);
}
