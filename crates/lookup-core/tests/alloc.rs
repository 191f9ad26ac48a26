//! A probe answered from the result cache allocates nothing:
//! counted with dhat's heap profiler as the global allocator.

use std::time::{Duration, Instant};

use lookup_core::{BlockHashes, Config, Dispatcher, Lookups, Probe, Reply, Request, RequestId};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

#[test]
fn cached_probe_does_not_allocate() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let mut config = Config::new(16);
    config.lookup_async = true;
    config.lookup_prefetch_limit = 4;
    let mut lookups = Lookups::new(config.clone()).unwrap();
    let mut dispatcher: Dispatcher = Dispatcher::new(&config);
    let chain: Vec<u64> = (0..64).collect();
    let req = Request {
        request_id: RequestId(1),
        num_tokens: 64 * 16 + 3,
        block_hashes: BlockHashes::from_u64s(&chain),
        skip_reading_external_kv: false,
    };
    let now = Instant::now();
    lookups.on_new_request(&req, now);
    while let Some(cmd) = lookups.poll_transmit() {
        dispatcher.push(cmd, (), now);
    }
    let out = dispatcher.poll_transmit(now).unwrap();
    assert!(dispatcher.handle_reply(out.rpc_id, Reply::Lookup { hit_tokens: 512 }, now));
    let (event, ()) = dispatcher.poll_event().unwrap();
    lookups.handle_wire_event(event);
    while lookups.poll_event().is_some() {}

    let later = now + Duration::from_millis(5);
    let before = dhat::HeapStats::get();
    let mut total = 0u32;
    for n in 0..1_000 {
        match lookups.probe(&req, (n % 3) * 16, later) {
            Probe::Ready {
                external_tokens, ..
            } => total += external_tokens,
            Probe::Pending => panic!("cached result must be ready"),
        }
    }
    let after = dhat::HeapStats::get();
    dhat::assert_eq!(after.total_blocks, before.total_blocks);
    // 1,000 probes over local hits 0, 16, 32: 512, 496, 480 external tokens.
    assert_eq!(total, 334 * 512 + 333 * 496 + 333 * 480);
}
