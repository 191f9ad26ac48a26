//! Edge cases of the store-key derivation that the golden vectors do not reach: empty
//! or short requests, bad deployments and bad worker ranks.

use lookup_core::BlockHashes;
use vllm_block_hash::{
    AttentionKind, Deployment, Error, KvCacheGroup, Parallelism, Ranks, StoreKeys,
};

fn chain(n: u8) -> BlockHashes {
    let hashes: Vec<[u8; 32]> = (0..n).map(|i| [i; 32]).collect();
    BlockHashes::from_hashes(&hashes).unwrap()
}

#[test]
fn lookups_below_one_block_or_without_hashes_ask_nothing() {
    let keys = StoreKeys::new(&Deployment::new("org/m", 16)).unwrap();
    assert_eq!(keys.lookup_keys(15, &chain(3)), Vec::<String>::new());
    assert_eq!(
        keys.lookup_keys(64, &BlockHashes::empty()),
        Vec::<String>::new()
    );
    // 40 tokens: two aligned blocks even though three hashes are given.
    assert_eq!(
        keys.lookup_keys(40, &chain(3)),
        [
            format!(
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{}",
                "00".repeat(32)
            ),
            format!(
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{}",
                "01".repeat(32)
            ),
        ]
    );
    // 64 tokens but two hashes: only the hashed blocks are asked about.
    assert_eq!(keys.lookup_keys(64, &chain(2)).len(), 2);
}

#[test]
fn a_chunk_is_keyed_by_its_last_hash() {
    let keys = StoreKeys::new(&Deployment::new("m", 64).with_hash_block_size(16)).unwrap();
    assert_eq!(keys.scheduler_block_size(), 64);
    let asked = keys.lookup_keys(200, &chain(9));
    // 200 tokens round down to 192: chunks 0..3, keyed by hashes 3, 7 and 11; only
    // 9 hashes exist, so two chunks.
    assert_eq!(
        asked,
        [
            format!(
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{}",
                "03".repeat(32)
            ),
            format!(
                "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{}",
                "07".repeat(32)
            ),
        ]
    );
    // A save of 144 tokens: chunk 2 is partial and keyed by the hash at token 144.
    let put = keys.put_keys(Ranks::default(), 144, &chain(9)).unwrap();
    let tails: Vec<&str> = put.iter().map(|k| &k[k.len() - 2..]).collect();
    assert_eq!(tails, ["03", "07", "08"]);
}

#[test]
fn bad_deployments_and_ranks_are_errors() {
    let bad = |d: Deployment| StoreKeys::new(&d).unwrap_err();
    assert_eq!(
        bad(Deployment::new("m", 16).with_parallelism(Parallelism::new(0, 1, 1, 1))),
        Error::BadDeployment {
            what: "tp_size",
            why: "must be at least 1".to_owned()
        }
    );
    assert!(matches!(
        bad(Deployment::new("m", 48).with_hash_block_size(32)),
        Error::BadDeployment {
            what: "hash_block_size",
            ..
        }
    ));
    assert_eq!(
        bad(Deployment::new("m", 16).with_parallelism(Parallelism::tp(2).with_dcp(4))),
        Error::BadDeployment {
            what: "dcp_size",
            why: "4 does not divide tp_size 2".to_owned()
        }
    );
    assert!(matches!(
        bad(Deployment::new("m", 16).with_groups(Vec::new())),
        Error::BadDeployment { what: "groups", .. }
    ));
    let keys = StoreKeys::new(
        &Deployment::new("m", 16)
            .with_parallelism(Parallelism::tp(2))
            .with_groups(vec![KvCacheGroup {
                kind: AttentionKind::Mla,
                block_size: 16,
            }]),
    )
    .unwrap();
    // MLA: every TP rank holds the same latent cache, so one namespace.
    assert_eq!(keys.lookup_prefixes(0).unwrap().len(), 1);
    assert_eq!(
        keys.put_keys(Ranks::new(2, 0, 0, 0), 16, &chain(1))
            .unwrap_err(),
        Error::BadRank {
            what: "tp_rank",
            rank: 2,
            size: 2
        }
    );
    assert_eq!(
        keys.put_keys(Ranks::default(), 40, &chain(3)).unwrap_err(),
        Error::NotEnoughHashes {
            token_len: 40,
            hash_block_size: 16,
            hashes: 3
        }
    );
    assert_eq!(
        keys.put_keys(Ranks::default(), 64, &chain(3)).unwrap_err(),
        Error::NotEnoughHashes {
            token_len: 64,
            hash_block_size: 16,
            hashes: 3
        }
    );
}

#[test]
fn parallelism_by_name_equals_the_positional_form() {
    assert_eq!(Parallelism::tp(1), Parallelism::default());
    assert_eq!(
        Parallelism::tp(4).with_pcp(2).with_dcp(2).with_pp(3),
        Parallelism::new(4, 2, 2, 3)
    );
    let p = Parallelism::tp(2).with_dcp(2);
    assert_eq!((p.tp_size, p.pcp_size, p.dcp_size, p.pp_size), (2, 1, 2, 1));
    // TP 2 x DCP 2: one namespace per TP rank, dcp_rank = tp_rank % dcp_size.
    let keys = StoreKeys::new(&Deployment::new("m", 16).with_parallelism(p)).unwrap();
    assert_eq!(
        keys.lookup_prefixes(0).unwrap(),
        [
            "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0",
            "m@tp_rank:1@pcp0@dcp1@pp_rank:0@group:0"
        ]
    );
}
