//! An async scheduler loop on tokio: a front-end task announces arrivals through a
//! cloned `LookupHandle` before the hop to the scheduler; the scheduler probes each
//! waiting request with prefetch plus a bounded wait (`probe_until` at
//! `step_deadline()`: async mode with a `probe_budget`, `Deadline::Within`), allocates, preempts one request when its
//! KV budget runs out and resumes it later, and finishes each.
//!
//! It starts its own reference lookup server on 127.0.0.1 with the first blocks of
//! some prompts stored, and checks every answer against what was stored.
//!
//! Run: `cargo run -p lookup-tokio --example async_scheduler` (`cargo test -p
//! lookup-tokio --example async_scheduler` runs it as a test).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
use lookup_tokio::{BlockHashes, KeyLayout, LookupClient, Probe, Request, RequestId};

/// Block size in tokens (vLLM's default).
const BLOCK: u32 = 16;
/// KV blocks the scheduler can hand out at once: too few for every request, so one
/// is preempted.
const KV_BLOCKS: u32 = 12;

/// Request `id`: `blocks` full blocks plus 3 tokens, of which `stored` are in the store.
struct Prompt {
    id: u64,
    blocks: u32,
    stored: u32,
}

const PROMPTS: [Prompt; 5] = [
    Prompt {
        id: 1,
        blocks: 4,
        stored: 4,
    },
    Prompt {
        id: 2,
        blocks: 6,
        stored: 2,
    },
    Prompt {
        id: 3,
        blocks: 3,
        stored: 0,
    },
    Prompt {
        id: 4,
        blocks: 5,
        stored: 5,
    },
    Prompt {
        id: 5,
        blocks: 2,
        stored: 1,
    },
];

fn request(p: &Prompt) -> Request {
    let hashes: Vec<u64> = (0..u64::from(p.blocks)).map(|b| p.id * 1000 + b).collect();
    Request {
        request_id: RequestId(p.id),
        num_tokens: p.blocks * BLOCK + 3,
        block_hashes: BlockHashes::from_u64s(&hashes),
        skip_reading_external_kv: false,
    }
}

/// What the scheduler did with a request, for the checks at the end.
#[derive(Debug, Default)]
struct Outcome {
    external_tokens: Vec<u32>,
    preempted: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The store: the reference server over an in-memory index.
    let layout = KeyLayout::new("Qwen3-8B");
    let index = Arc::new(InMemoryIndex::new());
    for p in &PROMPTS {
        index.insert_chain(&layout, &request(p).block_hashes, p.stored as usize);
    }
    let server = LookupServer::bind(
        &"tcp://127.0.0.1:0".parse()?,
        ServerConfig::new(BLOCK, layout),
        index,
    )?;

    // Async mode with prefetch, and a 50 ms wait per probe for a lookup on the wire.
    let mut client = LookupClient::builder()
        .zmq_endpoint(server.local_endpoint().clone())
        .block_size(BLOCK)
        .lookup_async(true)
        .lookup_prefetch_limit(8)
        .probe_budget(Duration::from_millis(50))
        .client_label("engine-0")
        // A scheduler starts whether or not its store is up yet: lazy.
        .connect_lazy()?;

    // The front end: announces each arrival, then hands the request to the scheduler.
    let handle = client.handle();
    let (to_scheduler, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let front_end = tokio::spawn(async move {
        for p in &PROMPTS {
            let req = request(p);
            handle.on_new_request_with_id(req.clone(), &format!("cmpl-{}", p.id))?;
            to_scheduler
                .send(req)
                .map_err(|_| lookup_tokio::Error::Closed)?;
        }
        Ok::<_, lookup_tokio::Error>(())
    });

    let mut waiting: VecDeque<Request> = VecDeque::new();
    let mut running: Vec<(Request, u32)> = Vec::new();
    let mut outcomes: Vec<Outcome> = (0..=PROMPTS.len()).map(|_| Outcome::default()).collect();
    let mut finished = 0;
    let mut step = 0u32;
    let mut preempted_once = false;
    while finished < PROMPTS.len() {
        step += 1;
        if step > 1_000 {
            return Err("the scheduler made no progress in 1,000 steps".into());
        }
        // Idle: sleep until the front end hands over the next arrival.
        if waiting.is_empty() && running.is_empty() {
            match arrivals.recv().await {
                Some(req) => waiting.push_back(req),
                None => return Err("the front end stopped early".into()),
            }
        }
        while let Ok(req) = arrivals.try_recv() {
            waiting.push_back(req);
        }
        // Admit waiting requests while KV blocks last.
        let mut deferred = VecDeque::new();
        while let Some(req) = waiting.pop_front() {
            let used: u32 = running.iter().map(|(_, blocks)| blocks).sum();
            let needed = req.num_tokens.div_ceil(BLOCK);
            if used + needed > KV_BLOCKS {
                deferred.push_back(req);
                continue;
            }
            match client.probe_until(&req, 0, client.step_deadline()).await {
                // Not known within the budget: try again next step.
                Probe::Pending => deferred.push_back(req),
                Probe::Ready {
                    external_tokens, ..
                } => {
                    outcomes[req.request_id.0 as usize]
                        .external_tokens
                        .push(external_tokens);
                    client.on_allocated(req.request_id);
                    running.push((req, needed));
                }
            }
        }
        waiting = deferred;
        // The KV budget is short while requests wait: preempt the newest running
        // request once; it goes back to the waiting queue and is probed again.
        if !preempted_once && !waiting.is_empty() && running.len() > 1 {
            if let Some((req, _)) = running.pop() {
                client.on_preempted(req.request_id);
                outcomes[req.request_id.0 as usize].preempted = true;
                waiting.push_front(req);
                preempted_once = true;
            }
        }
        // One request finishes per step (decode is not modelled).
        if !running.is_empty() {
            let (req, _) = running.remove(0);
            client.on_finished(req.request_id);
            finished += 1;
        }
    }
    front_end.await??;

    let stats = client.stats();
    client.shutdown().await;
    server.shutdown().await;

    for p in &PROMPTS {
        let outcome = &outcomes[p.id as usize];
        let expected = p.stored * BLOCK;
        for &got in &outcome.external_tokens {
            if got != expected {
                return Err(format!(
                    "request {}: {got} external tokens, expected {expected}",
                    p.id
                )
                .into());
            }
        }
        println!(
            "request {}: {} external tokens (stored {} of {} blocks){}",
            p.id,
            expected,
            p.stored,
            p.blocks,
            if outcome.preempted {
                ", preempted once and resumed"
            } else {
                ""
            }
        );
    }
    if !outcomes.iter().any(|o| o.preempted) {
        return Err("no request was preempted".into());
    }
    if stats.tracked_requests != 0 {
        return Err(format!("{} requests still tracked", stats.tracked_requests).into());
    }
    println!(
        "{} lookups at arrival, {} at a probe; {} RPCs sent",
        stats.core.lookups_arrival, stats.core.lookups_probe, stats.rpcs_sent
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_example_runs() {
        super::main().expect("the async scheduler example");
    }
}
