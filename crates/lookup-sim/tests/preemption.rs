//! Preemption as vLLM V1 does it: the victim is the most recently scheduled running
//! request, and its blocks, generated ones included, stay in the prefix cache, so its
//! restart finds them again.

mod common;

use common::{req, run, tiny_params};
use lookup_core::OnPreemption;
use lookup_sim::mode::Mode;

/// One engine of 7 x 32 KV blocks of 16 tokens (7 trace blocks of 512). R1 (600
/// tokens [5], 1,400 outputs: 125 KV blocks at most) arrives at 0, R0 (1,024 tokens
/// [1, 2], 1,100 outputs: 133 blocks) at 5 ms; both decode side by side. When the two
/// need more than 224 blocks (about 980 tokens each decoded) the last scheduled
/// running request, R0, is preempted (vLLM `running.pop()`), once it is out of the
/// step in flight: with async scheduling (two batches) and the Mooncake connector
/// (`kv_both`) vLLM fences block frees behind the step in flight and does not
/// preempt a request scheduled in it (`_request_blocks_can_be_freed`). Its blocks,
/// generated ones included, stay cached when freed, so its restart (a prompt of
/// 1,024 prompt tokens plus those it generated) hits every full 16-token block of
/// that grown prompt: 1,584 tokens, more than the 1,024 of its prompt. It is
/// preempted once in either mode.
#[test]
fn a_preempted_request_hits_its_own_generated_blocks() {
    let trace = vec![req(0, 600, 1400, &[5]), req(5, 1024, 1100, &[1, 2])];
    let mut p = tiny_params(1);
    p.engine.gpu_kv_blocks = 7 * 32;
    let mut got = Vec::new();
    for mode in [Mode::Sync, Mode::Async] {
        let r = run(&trace, mode, &p);
        let (r1, r0) = (&r.records[0], &r.records[1]);
        assert_eq!(r.preemptions, u64::from(r0.preemptions), "{mode}");
        // The counter the mechanism reads: the most preemptions of one request.
        assert_eq!(r.preemptions_max, r0.preemptions, "{mode}");
        got.push((
            r1.preemptions,
            r0.preemptions,
            r1.local_hit_tokens,
            r0.local_hit_tokens,
        ));
    }
    // (R1's preemptions, R0's, R1's local hit tokens, R0's). With vLLM's 16-token
    // blocks the restart of R0 hits every full block of its grown prompt but the
    // last token's, not only whole 512-token groups.
    assert_eq!(got, vec![(0, 1, 0, 1584), (0, 1, 0, 1584)]);
}

/// Rule 8's policy in the engine model: the same two requests without a local prefix
/// cache, so every restart of R0 needs its lookup. With vLLM's `discard` the
/// restart's probe answers `Pending` and R0 is deferred a step, letting whatever is
/// behind it in; with `keep_wait` the kept result answers it, or, once older than the
/// 2 s TTL, the engine waits for a new answer (1 ms) instead of deferring.
#[test]
fn a_preempted_request_is_waited_for_not_deferred() {
    let trace = vec![req(0, 600, 1400, &[5]), req(5, 1024, 1100, &[1, 2])];
    let mut p = tiny_params(1);
    p.engine.gpu_kv_blocks = 7 * 32;
    p.engine.local_prefix_cache = false;
    let mut figures = Vec::new();
    for gate in [true, false] {
        p.engine.scheduler_reserve_full_isl = gate;
        for policy in [OnPreemption::Discard, OnPreemption::KeepWait] {
            p.lookup.on_preemption = policy;
            let r = run(&trace, Mode::Async, &p);
            figures.push((
                r.preemptions,
                r.deferred,
                r.preempted_waits.started,
                r.preempted_waits.caught,
                r.stats.lookups_kept_on_preemption,
            ));
        }
    }
    // (preemptions, deferrals, preempted waits started, caught, lookups kept).
    // R0 is preempted once (out of the step in flight, as vLLM's deferred block
    // frees allow; see the test above). Without vLLM's full-prompt gate
    // (`scheduler_reserve_full_isl = false`, the last two): with `discard` the two
    // first probes and the restart are deferred; with `keep_wait` the preemption
    // keeps R0's lookup and the restart, its result past the TTL, waits 1 ms for a
    // new one instead of being deferred. With the gate (vLLM's default, the first
    // two), `discard` defers twice more: a restart whose answer came while its whole
    // prompt did not fit probes again on later steps, with a new lookup; `keep_wait`
    // waits on each of those probes instead (3 waits, all caught).
    assert_eq!(
        figures,
        vec![
            (1, 5, 0, 0, 0),
            (1, 2, 3, 3, 1),
            (1, 3, 0, 0, 0),
            (1, 2, 1, 1, 1)
        ]
    );
}
