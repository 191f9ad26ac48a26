//! A thread-based scheduler (no async code in it): the client's I/O task runs on a
//! tokio runtime owned by the process, the scheduler loop on a plain thread calls the
//! blocking twins. Sync mode (vLLM's default, `lookup_async = false`):
//! `probe_until_blocking` at `step_deadline()` (`Deadline::Answer`) waits for each answer and never answers `Pending`.
//!
//! It starts its own reference lookup server on 127.0.0.1 and checks every answer
//! against what was stored.
//!
//! Run: `cargo run -p lookup-tokio --example thread_scheduler` (`cargo test -p
//! lookup-tokio --example thread_scheduler` runs it as a test).

use std::sync::Arc;

use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
use lookup_tokio::{BlockHashes, KeyLayout, LookupClient, Probe, Request, RequestId};

/// Block size in tokens (vLLM's default).
const BLOCK: u32 = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The runtime that hosts the I/O task (and here the server), kept for the
    // client's whole life.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;

    let layout = KeyLayout::new("Qwen3-8B");
    let index = Arc::new(InMemoryIndex::new());
    // Request i has 4 blocks; the store holds its first i % 5 of them.
    let requests: Vec<Request> = (1..=10u64)
        .map(|i| {
            let hashes: Vec<u64> = (0..4).map(|b| i * 100 + b).collect();
            Request {
                request_id: RequestId(i),
                num_tokens: 4 * BLOCK + 5,
                block_hashes: BlockHashes::from_u64s(&hashes),
                skip_reading_external_kv: false,
            }
        })
        .collect();
    for req in &requests {
        index.insert_chain(&layout, &req.block_hashes, (req.request_id.0 % 5) as usize);
    }
    let server = runtime.block_on(async {
        LookupServer::bind(
            &"tcp://127.0.0.1:0".parse()?,
            ServerConfig::new(BLOCK, layout),
            index,
        )
        .map_err(Box::<dyn std::error::Error>::from)
    })?;

    let mut client = LookupClient::builder()
        .zmq_endpoint(server.local_endpoint().clone())
        .block_size(BLOCK)
        // A scheduler starts whether or not its store is up yet: lazy.
        .connect_lazy_with_handle(runtime.handle())?;

    // The scheduler's thread: one blocking probe per request, then allocate and
    // finish; a local (GPU) hit of one block is taken off the external tokens.
    let scheduler = std::thread::spawn(move || {
        let mut answers = Vec::new();
        for req in &requests {
            client.on_new_request(req);
            let probe = client.probe_until_blocking(req, BLOCK, client.step_deadline())?;
            answers.push((req.request_id, probe));
            client.on_allocated(req.request_id);
            client.on_finished(req.request_id);
        }
        let stats = client.stats();
        client.close();
        Ok::<_, lookup_tokio::Error>((answers, stats))
    });
    let (answers, stats) = scheduler
        .join()
        .map_err(|_| "the scheduler thread panicked")??;
    runtime.block_on(server.shutdown());

    for (request_id, probe) in &answers {
        let stored = (request_id.0 % 5) as u32;
        let expected = stored.saturating_sub(1) * BLOCK;
        let want = Probe::Ready {
            external_tokens: expected,
            load_async: expected > 0,
        };
        if *probe != want {
            return Err(format!("request {}: {probe:?}, expected {want:?}", request_id.0).into());
        }
        println!("request {}: {expected} external tokens", request_id.0);
    }
    if stats.rpcs_sent != 10 || stats.tracked_requests != 0 || stats.waits_gave_up != 0 {
        return Err(format!("unexpected counters: {stats:?}").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_example_runs() {
        super::main().expect("the thread scheduler example");
    }
}
