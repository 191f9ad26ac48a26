//! Shared by the simulator's test binaries: tiny traces with round-number costs, and
//! a run that keeps every finished request.

#![allow(dead_code)]

use std::sync::Mutex;

use lookup_sim::budget::WaitBudget;
use lookup_sim::engine::{
    ArrivalHandling, EngineParams, ModeResult, PendingPolicy, RequestRecord, Router, SimParams,
    StoreParams, simulate,
};
use lookup_sim::mode::{LookupParams, Mode};
use lookup_sim::server::ServerParams;
use lookup_sim::trace::TraceRequest;

pub(crate) fn req(
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    hash_ids: &[u64],
) -> TraceRequest {
    TraceRequest {
        timestamp,
        input_length,
        output_length,
        hash_ids: hash_ids.to_vec(),
    }
}

/// Round numbers: a step costs 10 ms + 10 µs per prefill token, nothing else; the
/// scheduler is free; a lookup takes 1 ms; a load 2 ms per block.
pub(crate) fn tiny_params(engines: u32) -> SimParams {
    SimParams {
        engine: EngineParams {
            engines,
            router: Router::RoundRobin,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            gpu_kv_blocks: 3_200,
            step_fixed_s: 0.01,
            prefill_token_s: 0.000_01,
            prefill_pair_s: 0.0,
            decode_seq_s: 0.0,
            decode_ctx_token_s: 0.0,
            scheduler_s: 0.0,
            scheduler_probe_s: 0.0,
            arrivals: ArrivalHandling::WhileWaiting,
            on_pending: PendingPolicy::Skip,
            batch_queue: 2,
            max_output_tokens: None,
            local_prefix_cache: true,
            prefix_hash_tokens: 16,
            scheduler_reserve_full_isl: true,
            load_kv_async: true,
        },
        store: StoreParams {
            capacity_blocks: 100,
            load_fixed_s: 0.0,
            load_block_s: 0.002,
        },
        server: ServerParams {
            fixed_s: 0.001,
            per_call_s: 0.0,
            present_key_s: 0.0,
            absent_key_s: 0.0,
            block_size: 512,
            namespaces: 1,
            chunk_keys: 0,
            concurrency: 1,
            jitter_s: 0.0,
            shared: false,
        },
        lookup: LookupParams {
            prefetch_limit: 4,
            prefetch_ttl_s: 2.0,
            timeout_s: 5.0,
            wait_budget: WaitBudget::Fixed { s: 0.005 },
            ..LookupParams::default()
        },
        rate_scale: 1.0,
        seed: 0,
        order_seed: 0,
        route_offset: 0,
        timeseries: false,
    }
}

/// A run's figures and its finished requests, in trace order.
pub(crate) struct Run {
    pub(crate) result: ModeResult,
    pub(crate) records: Vec<RequestRecord>,
}

impl std::ops::Deref for Run {
    type Target = ModeResult;

    fn deref(&self) -> &ModeResult {
        &self.result
    }
}

impl Run {
    pub(crate) fn ttft_ns(&self) -> Vec<u64> {
        self.records.iter().map(|r| r.ttft_ns).collect()
    }

    pub(crate) fn queue_wait_ns(&self) -> Vec<u64> {
        self.records.iter().map(|r| r.queue_wait_ns).collect()
    }
}

pub(crate) fn run(trace: &[TraceRequest], mode: Mode, params: &SimParams) -> Run {
    let records = Mutex::new(Vec::new());
    let result = simulate(trace.iter().cloned().map(Ok), mode, params, &|r| {
        records.lock().unwrap().push(r.clone());
    })
    .unwrap();
    let mut records = records.into_inner().unwrap();
    records.sort_by_key(|r| r.seq);
    Run { result, records }
}

pub(crate) const MS: u64 = 1_000_000;
