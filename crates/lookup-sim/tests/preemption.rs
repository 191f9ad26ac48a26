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
/// running request, R0, is preempted (vLLM `running.pop()`). Its blocks: two prompt
/// groups, one full group of generated tokens and a partial one; freed tail first,
/// they stay cached. Restarted with a prompt of 1,024 + ~980 tokens (capped at 3
/// groups of hit), it finds all three full groups again: 1,536 local hit tokens, and
/// only needs ~30 more blocks, so it is readmitted while R1 still decodes and
/// preempted again when R1 grows: 4 preemptions in sync mode (3 in async), each
/// restart hitting 1,536 tokens. Hashing prompt blocks only would find 1,024 per restart.
#[test]
fn a_preempted_request_hits_its_own_generated_blocks() {
    let trace = vec![req(0, 600, 1400, &[5]), req(5, 1024, 1100, &[1, 2])];
    let mut p = tiny_params(1);
    p.engine.gpu_kv_blocks = 7 * 32;
    // In async mode R0's first probe answers `Pending` (its lookup is out), so it
    // starts a step later than in sync mode and is readmitted one fewer time.
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
    // blocks each restart of R0 hits every full block of its grown prompt but the
    // last token's (about 1,884 tokens), not only the three whole 512-token groups
    // (1,536 each with the coarser groups).
    assert_eq!(got, vec![(0, 4, 0, 7536), (0, 3, 0, 5552)]);
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
    // Without vLLM's full-prompt gate (`scheduler_reserve_full_isl = false`, the
    // last two): with `discard` the two first probes and the two restarts are
    // deferred; with `keep_wait` both preemptions keep R0's lookup, one restart reads
    // it, the other (its result past the TTL) waits 1 ms for a new one instead of
    // being deferred. With the gate (vLLM's default, the first two), `discard`
    // defers twice more: a restart whose answer came while its whole prompt did not
    // fit probes again on a later step, with a new lookup.
    assert_eq!(
        figures,
        vec![
            (2, 6, 0, 0, 0),
            (2, 2, 1, 1, 2),
            (2, 4, 0, 0, 0),
            (2, 2, 1, 1, 2)
        ]
    );
}
