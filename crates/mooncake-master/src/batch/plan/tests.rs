use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

/// A store: key -> answer; missing keys answer `false`.
type Store = HashMap<String, ExistResult>;

fn answer(store: &Store, key: &str) -> ExistResult {
    store.get(key).copied().unwrap_or(Ok(false))
}

/// Drives `plan` against `store` to the end; returns the calls made (their keys).
fn drive(plan: &mut LeadingRuns, store: &Store, assume: &dyn Fn(&str) -> bool) -> Vec<Vec<String>> {
    let mut made = Vec::new();
    while let Some(calls) = plan.next_round(&mut |k| assume(k)) {
        for keys in calls {
            let answers: Vec<ExistResult> = keys.iter().map(|k| answer(store, k)).collect();
            plan.record(&keys, &answers).unwrap();
            made.push(keys);
        }
    }
    made
}

/// What `MasterClient::leading_blocks_flat` asks and answers for one chain (the
/// client's loop, over the store instead of the network).
fn unbatched(
    store: &Store,
    keys: &[String],
    kpb: usize,
    chunk: usize,
) -> (Result<usize, Option<usize>>, Vec<Vec<String>>) {
    let blocks = keys.len() / kpb;
    let mut calls = Vec::new();
    let (mut present, mut start) = (0, 0);
    while start < blocks {
        let mut end = start;
        let mut total = 0;
        while end < blocks {
            if end > start && total + kpb > chunk {
                break;
            }
            total += kpb;
            end += 1;
        }
        let call: Vec<String> = keys[start * kpb..end * kpb].to_vec();
        let answers: Vec<ExistResult> = call.iter().map(|k| answer(store, k)).collect();
        calls.push(call);
        for i in 0..end - start {
            let a = &answers[i * kpb..(i + 1) * kpb];
            if a.contains(&Ok(false)) {
                return (Ok(present), calls);
            }
            if let Some(j) = a.iter().position(Result::is_err) {
                return (Err(Some((start + i) * kpb + j)), calls);
            }
            present += 1;
        }
        start = end;
    }
    (Ok(present), calls)
}

fn flatten(result: &Result<usize, MasterError>) -> Result<usize, Option<usize>> {
    match result {
        Ok(n) => Ok(*n),
        Err(MasterError::Store { key_index, .. }) => Err(*key_index),
        Err(e) => panic!("unexpected {e}"),
    }
}

fn keys(prefix: &str, blocks: std::ops::Range<usize>, namespaces: usize) -> Vec<String> {
    blocks
        .flat_map(|b| (0..namespaces).map(move |n| format!("{prefix}{b}@ns{n}")))
        .collect()
}

fn store_of(present: &[String]) -> Store {
    present.iter().map(|k| (k.clone(), Ok(true))).collect()
}

#[test]
fn one_lookup_asks_exactly_what_the_unbatched_query_asks() {
    let chain = keys("h", 0..10, 2);
    let store = store_of(&chain[..14]);
    let mut plan = LeadingRuns::new(4);
    plan.add(chain.clone(), 2);
    let made = drive(&mut plan, &store, &|_| false);
    let (run, calls) = unbatched(&store, &chain, 2, 4);
    assert_eq!(made, calls);
    assert_eq!(made.len(), 4);
    assert_eq!(plan.keys_asked(), 16);
    assert_eq!(flatten(&plan.into_results()[0]), run);
    assert_eq!(run, Ok(7));
}

#[test]
fn shared_prefixes_are_asked_once_and_each_lookup_stops_on_its_own() {
    // Three lookups share a 6-block system prefix; their own tails differ.
    let prefix = keys("sys", 0..6, 1);
    let mut a = prefix.clone();
    a.extend(keys("a", 0..4, 1));
    let mut b = prefix.clone();
    b.extend(keys("b", 0..4, 1));
    let c = prefix[..3].to_vec();
    let mut present = prefix.clone();
    present.extend(keys("a", 0..4, 1));
    present.extend(keys("b", 0..1, 1));
    let store = store_of(&present);
    let mut plan = LeadingRuns::new(1024);
    plan.add(a, 1);
    plan.add(b, 1);
    plan.add(c, 1);
    let made = drive(&mut plan, &store, &|_| false);
    // One call: the union of the three windows, each key once (6 + 4 + 4).
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].len(), 14);
    assert_eq!(plan.keys_asked(), 14);
    let results: Vec<_> = plan.into_results().iter().map(flatten).collect();
    assert_eq!(results, vec![Ok(10), Ok(7), Ok(3)]);
}

#[test]
fn the_early_stop_holds_for_each_lookup_across_rounds() {
    // chunk 2 keys: lookup x misses at block 1 and asks nothing after round 1; y runs on.
    let x = keys("x", 0..6, 1);
    let y = keys("y", 0..6, 1);
    let mut present = x[..1].to_vec();
    present.extend(y.clone());
    let store = store_of(&present);
    let mut plan = LeadingRuns::new(2);
    plan.add(x, 1);
    plan.add(y, 1);
    let made = drive(&mut plan, &store, &|_| false);
    let sizes: Vec<usize> = made.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![2, 2, 2, 2]);
    assert_eq!(plan.keys_asked(), 8);
    let results: Vec<_> = plan.into_results().iter().map(flatten).collect();
    assert_eq!(results, vec![Ok(1), Ok(6)]);
}

#[test]
fn assumed_keys_are_not_asked_and_only_the_unknown_tail_is() {
    let chain = keys("c", 0..8, 2);
    let store = store_of(&chain[..12]);
    let cached: Vec<String> = chain[..8].to_vec();
    let mut plan = LeadingRuns::new(1024);
    plan.add(chain, 2);
    let made = drive(&mut plan, &store, &|k| cached.iter().any(|c| c == k));
    // The block after the cached prefix first (present), then the rest of the window.
    assert_eq!(made, vec![keys("c", 4..5, 2), keys("c", 5..8, 2)]);
    assert_eq!(plan.keys_assumed(), 8);
    assert_eq!(plan.keys_asked(), 8);
    // Only keys the master answered count as learned.
    let mut learned: Vec<&str> = plan.present_keys().collect();
    learned.sort_unstable();
    assert_eq!(learned.len(), 4);
    assert_eq!(flatten(&plan.into_results()[0]), Ok(6));
}

/// After a cached prefix only the next block is asked: when the master answers it
/// absent (the usual case: the cache holds what it last answered present), the absent
/// tail is never asked. A lookup with nothing cached asks its whole window at once.
#[test]
fn after_a_cached_prefix_one_block_is_asked_before_the_window() {
    let chain = keys("c", 0..400, 1);
    let store = store_of(&chain[..200]);
    let cached: Vec<String> = chain[..200].to_vec();
    let mut plan = LeadingRuns::new(1024);
    plan.add(chain.clone(), 1);
    let made = drive(&mut plan, &store, &|k| cached.iter().any(|c| c == k));
    assert_eq!(made, vec![keys("c", 200..201, 1)]);
    assert_eq!(plan.keys_asked(), 1);
    assert_eq!(flatten(&plan.into_results()[0]), Ok(200));
    let mut cold = LeadingRuns::new(1024);
    cold.add(chain, 1);
    let made = drive(&mut cold, &store, &|_| false);
    assert_eq!(made, vec![keys("c", 0..400, 1)]);
    assert_eq!(flatten(&cold.into_results()[0]), Ok(200));
}

#[test]
fn a_failed_call_fails_only_the_lookups_that_needed_it() {
    let a = keys("a", 0..4, 1);
    let b = keys("b", 0..4, 1);
    let store = store_of(&a);
    let mut plan = LeadingRuns::new(4);
    plan.add(a.clone(), 1);
    plan.add(b, 1);
    plan.add(Vec::new(), 1);
    plan.add(a.clone(), 0);
    let calls = plan.next_round(&mut |_| false).unwrap();
    assert_eq!(calls.len(), 2);
    let answers: Vec<ExistResult> = calls[0].iter().map(|k| answer(&store, k)).collect();
    plan.record(&calls[0], &answers).unwrap();
    let timeout = MasterError::Timeout {
        function: crate::FunctionId::BATCH_EXIST_KEY,
        after: std::time::Duration::from_secs(1),
    };
    plan.record_failure(&calls[1], timeout);
    assert!(plan.next_round(&mut |_| false).is_none());
    let results = plan.into_results();
    assert_eq!(results[0].as_ref().ok(), Some(&4));
    assert!(matches!(results[1], Err(MasterError::Timeout { .. })));
    assert_eq!(results[2].as_ref().ok(), Some(&0));
    assert!(matches!(results[3], Err(MasterError::InvalidConfig { .. })));
    assert!(matches!(
        LeadingRuns::new(4).record(&["k".to_owned()], &[]),
        Err(MasterError::AnswerCount {
            expected: 1,
            got: 0
        })
    ));
}

#[test]
fn a_key_error_ends_the_run_with_the_lookups_own_key_index() {
    let chain = keys("e", 0..4, 2);
    let mut store = store_of(&chain);
    store.insert(chain[5].clone(), Err(StoreErrorCode(-1)));
    let other = chain[4..].to_vec();
    let mut plan = LeadingRuns::new(1024);
    plan.add(chain.clone(), 2);
    plan.add(other.clone(), 2);
    drive(&mut plan, &store, &|_| false);
    let results: Vec<_> = plan.into_results().iter().map(flatten).collect();
    assert_eq!(results, vec![Err(Some(5)), Err(Some(1))]);
    assert_eq!(results[0], unbatched(&store, &chain, 2, 1024).0);
    assert_eq!(results[1], unbatched(&store, &other, 2, 1024).0);
}

proptest! {
    /// Batched answers equal unbatched answers, and no key is asked twice in a round
    /// or more often than the unbatched queries ask it, over random chains that share
    /// prefixes, several namespaces and small chunks.
    #[test]
    fn batched_answers_equal_unbatched_answers(
        seeds in proptest::collection::vec((0usize..3, 0usize..12, 0usize..12, 0usize..3), 1..8),
        namespaces in 1usize..4,
        chunk in 1usize..12,
        stored in proptest::collection::vec(0usize..12, 3),
    ) {
        let mut plan = LeadingRuns::new(chunk);
        let mut chains = Vec::new();
        let mut present = Vec::new();
        for (root, &n) in stored.iter().enumerate() {
            present.extend(keys(&format!("r{root}b"), 0..n, namespaces));
        }
        for (root, shared, own, tail) in seeds {
            let mut chain = keys(&format!("r{root}b"), 0..shared, namespaces);
            chain.extend(keys(&format!("own{}-", chains.len()), 0..own, namespaces));
            chain.extend(keys("partial", 0..1, tail.min(namespaces - 1)));
            present.extend(keys(&format!("own{}-", chains.len()), 0..own / 2, namespaces));
            plan.add(chain.clone(), namespaces);
            chains.push(chain);
        }
        let store = store_of(&present);
        let made = drive(&mut plan, &store, &|_| false);
        let mut asked_unbatched = 0;
        for call in &made {
            prop_assert!(call.len() <= chunk);
        }
        let results: Vec<_> = plan.into_results().iter().map(flatten).collect();
        for (chain, result) in chains.iter().zip(&results) {
            let (run, calls) = unbatched(&store, chain, namespaces, chunk);
            asked_unbatched += calls.iter().map(Vec::len).sum::<usize>();
            prop_assert_eq!(*result, run);
        }
        let asked: usize = made.iter().map(Vec::len).sum();
        prop_assert!(asked <= asked_unbatched, "{} > {}", asked, asked_unbatched);
    }
}

fn unavailable(why: &str) -> MasterError {
    MasterError::Unavailable {
        addr: "m".to_owned(),
        last_error: why.to_owned(),
    }
}

/// A block whose keys went in two calls, one failed and one answered `false`, ends as
/// the failure whatever the order of its keys: a failure never reads as a miss.
#[test]
fn a_block_split_across_a_failed_call_and_a_false_answer_is_unavailable() {
    for failed_first in [true, false] {
        // Chunks of 1 key: block 0's two keys go in two calls of one round.
        let mut plan = LeadingRuns::new(1);
        plan.add(keys("a", 0..1, 2), 2);
        let calls = plan.next_round(&mut |_| false).unwrap();
        assert_eq!(
            calls,
            vec![vec!["a0@ns0".to_owned()], vec!["a0@ns1".to_owned()]]
        );
        let (failed, answered) = if failed_first { (0, 1) } else { (1, 0) };
        plan.record_failure(&calls[failed], unavailable("reset by peer"));
        plan.record(&calls[answered], &[Ok(false)]).unwrap();
        assert!(plan.next_round(&mut |_| false).is_none());
        let results = plan.into_results();
        assert!(
            matches!(&results[0], Err(MasterError::Unavailable { last_error, .. }) if last_error == "reset by peer"),
            "failed_first {failed_first}: {results:?}"
        );
    }
}

/// Each lookup is handed out once its own run is known: a 1-key miss after the first
/// round, before the long lookup's later rounds are asked; answers resting on keys
/// taken from the cache say so.
#[test]
fn each_lookup_is_finished_at_its_own_early_stop() {
    let long = keys("l", 0..4, 1);
    let store = store_of(&long);
    let mut plan = LeadingRuns::new(1);
    plan.add(long.clone(), 1);
    plan.add(vec!["miss".to_owned()], 1);
    plan.add(vec![long[0].clone(), "c".to_owned()], 1);
    let assume = |k: &str| k == "c";
    let mut finished_per_round = Vec::new();
    loop {
        let round = plan.next_round(&mut |k| assume(k));
        finished_per_round.push(plan.take_finished());
        let Some(calls) = round else { break };
        for keys in calls {
            let answers: Vec<ExistResult> = keys.iter().map(|k| answer(&store, k)).collect();
            plan.record(&keys, &answers).unwrap();
        }
    }
    let summary: Vec<Vec<(usize, usize, bool)>> = finished_per_round
        .iter()
        .map(|round| {
            round
                .iter()
                .map(|(i, r, cached)| (*i, *r.as_ref().unwrap(), *cached))
                .collect()
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            vec![],
            vec![(1, 0, false), (2, 2, true)],
            vec![],
            vec![],
            vec![(0, 4, false)],
        ]
    );
    assert!(plan.take_finished().is_empty(), "each answer once");
}
