//! Preemption as vLLM V1 does it: the victim is the most recently scheduled running
//! request, and its blocks, generated ones included, stay in the prefix cache, so its
//! restart finds them again.

mod common;

use common::{req, run, tiny_params};
use lookup_sim::mode::Mode;

/// One engine of 7 blocks (512 tokens). R1 (600 tokens [5], 1,400 outputs: 4 blocks at
/// most) arrives at 0, R0 (1,024 tokens [1, 2], 1,100 outputs: 5 blocks) at 5 ms; both
/// decode side by side. When R1 reaches position 1,536 (its 4th block) R0 holds 4
/// blocks (1,024 + ~930 tokens): 8 > 7, so the last scheduled running request, R0, is
/// preempted (vLLM `running.pop()`). Its blocks: two prompt blocks, one full block of
/// generated tokens and a partial one. Restarted with a prompt of 1,024 + ~930 tokens
/// (capped at 3 blocks of hit), it finds all three full blocks again once R1 is done:
/// 1,536 local hit tokens. Hashing prompt blocks only would find 1,024.
#[test]
fn a_preempted_request_hits_its_own_generated_blocks() {
    let trace = vec![req(0, 600, 1400, &[5]), req(5, 1024, 1100, &[1, 2])];
    let mut p = tiny_params(1);
    p.engine.gpu_kv_blocks = 7;
    for mode in [Mode::Sync, Mode::Async] {
        let r = run(&trace, mode, &p);
        let (r1, r0) = (&r.records[0], &r.records[1]);
        assert_eq!((r1.preemptions, r0.preemptions), (0, 1), "{mode}");
        assert_eq!(
            (r1.local_hit_tokens, r0.local_hit_tokens),
            (0, 1536),
            "{mode}"
        );
        assert_eq!(r.preemptions, 1, "{mode}");
    }
}
