//! Router-side cost of building vLLM's keys for one request: the block-hash chain of
//! a 32,768-token prompt (2,048 blocks of 16 tokens) with each algorithm, and its
//! lookup keys over 8 rank namespaces (16,384 keys).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use vllm_block_hash::{
    BlockHasher, Deployment, HashAlgo, NoneHashSeed, Parallelism, RequestExtraKeys, StoreKeys,
};

const BLOCKS: usize = 2048;
const BLOCK_SIZE: usize = 16;

fn benches(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..BLOCKS * BLOCK_SIZE)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) % 151_936)
        .collect();
    let extra = RequestExtraKeys::new().with_cache_salt("tenant-42");
    let mut group = c.benchmark_group("chain_2048_blocks");
    group.throughput(Throughput::Elements(BLOCKS as u64));
    for algo in [HashAlgo::Sha256, HashAlgo::Sha256Cbor] {
        let hasher = BlockHasher::new(algo, &NoneHashSeed::default(), BLOCK_SIZE).unwrap();
        group.bench_function(algo.as_str(), |b| {
            b.iter(|| hasher.block_hashes(black_box(&tokens), &extra).unwrap())
        });
    }
    group.finish();

    let hasher = BlockHasher::new(HashAlgo::Sha256, &NoneHashSeed::default(), BLOCK_SIZE).unwrap();
    let chain = hasher.block_hashes(&tokens, &extra).unwrap();
    let keys = StoreKeys::new(
        &Deployment::new("meta-llama/Llama-3.1-70B-Instruct", BLOCK_SIZE as u32)
            .with_parallelism(Parallelism::new(4, 1, 1, 2)),
    )
    .unwrap();
    let num_tokens = tokens.len() as u32;
    let mut group = c.benchmark_group("lookup_keys_2048_blocks_8_namespaces");
    group.throughput(Throughput::Elements((BLOCKS * 8) as u64));
    group.bench_function("lookup_keys", |b| {
        b.iter(|| keys.lookup_keys(black_box(num_tokens), &chain))
    });
    group.finish();
}

criterion_group!(block_hash, benches);
criterion_main!(block_hash);
