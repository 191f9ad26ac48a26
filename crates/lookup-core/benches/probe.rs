//! Caller cost of the core: a probe answered from the result cache, and a whole
//! arrival → send → reply → probe → allocate cycle, with a 64-hash chain
//! (goal: ≤ 1 µs per cycle; a cached probe does not allocate).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lookup_core::{BlockHashes, Config, Dispatcher, Lookups, Reply, Request, RequestId};

fn config() -> Config {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 64;
    c.lookup_prefetch_ttl = Duration::from_secs(3600);
    c
}

fn request(id: u64) -> Request {
    let chain: Vec<u64> = (0..64).map(|i| id * 1_000 + i).collect();
    Request {
        request_id: RequestId(id),
        num_tokens: 64 * 16 + 5,
        block_hashes: BlockHashes::from_u64s(&chain),
        skip_reading_external_kv: false,
    }
}

fn benches(c: &mut Criterion) {
    let now = Instant::now();
    let mut lookups = Lookups::new(config()).unwrap();
    let mut dispatcher: Dispatcher = Dispatcher::new(&config());
    let req = request(1);
    lookups.on_new_request(&req, now);
    while let Some(cmd) = lookups.poll_transmit() {
        dispatcher.push(cmd, (), now);
    }
    let out = dispatcher.poll_transmit(now).unwrap();
    assert!(dispatcher.handle_reply(out.rpc_id, Reply::Lookup { hit_tokens: 512 }, now));
    let (event, ()) = dispatcher.poll_event().unwrap();
    lookups.handle_wire_event(event);
    while lookups.poll_event().is_some() {}
    let later = now + Duration::from_millis(1);
    c.bench_function("probe_cached_64_hashes", |b| {
        b.iter(|| black_box(lookups.probe(black_box(&req), black_box(16), later)));
    });

    // Requests are built up front: the cycle measures the core, not chain hashing.
    let reqs: Vec<Request> = (0..4096).map(request).collect();
    let mut lookups = Lookups::new(config()).unwrap();
    let mut dispatcher: Dispatcher = Dispatcher::new(&config());
    let mut i = 0usize;
    c.bench_function("cycle_arrival_probe_allocate_64_hashes", |b| {
        b.iter(|| {
            let req = &reqs[i % reqs.len()];
            i += 1;
            lookups.on_new_request(req, now);
            while let Some(cmd) = lookups.poll_transmit() {
                dispatcher.push(cmd, (), now);
            }
            let out = dispatcher.poll_transmit(now).unwrap();
            assert!(dispatcher.handle_reply(out.rpc_id, Reply::Lookup { hit_tokens: 512 }, later));
            let (event, ()) = dispatcher.poll_event().unwrap();
            lookups.handle_wire_event(event);
            while lookups.poll_event().is_some() {}
            let _ = black_box(lookups.probe(req, 16, later));
            lookups.on_allocated(req.request_id);
            lookups.on_finished(req.request_id);
        });
    });
}

criterion_group!(probe, benches);
criterion_main!(probe);
