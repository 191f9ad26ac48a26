"""vllm_core loads vLLM 0.33.0's own Scheduler from the wheel and runs one request."""

import vllm_core

SETTINGS = dict(block_size=16, num_gpu_blocks=64, max_num_seqs=4, max_num_batched_tokens=64,
                max_model_len=4096, enable_chunked_prefill=True, enable_prefix_caching=True,
                long_prefill_token_threshold=0, async_scheduling=False,
                scheduler_reserve_full_isl=True)


def test_the_scheduling_modules_are_vllms_own(core):
    kinds = dict(core.importer.loaded)
    for name in ("vllm.v1.core.sched.scheduler", "vllm.v1.core.kv_cache_manager",
                 "vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_coordinator",
                 "vllm.v1.core.single_type_kv_cache_manager", "vllm.v1.core.kv_cache_utils",
                 "vllm.v1.request", "vllm.v1.core.sched.request_queue"):
        assert kinds[name] == "verbatim", name
    assert core.Scheduler.__module__ == "vllm.v1.core.sched.scheduler"
    assert core.config_defaults["SchedulerConfig"]["scheduler_reserve_full_isl"] is True
    assert core.config_defaults["SchedulerConfig"]["watermark"] == 0.0


def test_one_request_is_chunked_then_decoded_until_max_tokens(core):
    sched = vllm_core.build_scheduler(core, SETTINGS)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 64
    sched.add_request(vllm_core.make_request(core, "r0", list(range(100)), 3, 16))
    steps = []
    while True:
        out = sched.schedule()
        if not out.num_scheduled_tokens:
            break
        free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        req = sched.requests["r0"]
        # schedule() already counts the scheduled tokens as computed.
        done = req.num_computed_tokens >= req.num_prompt_tokens
        mro = core.ModelRunnerOutput(req_ids=["r0"], req_id_to_index={"r0": 0},
                                     sampled_token_ids=[[7] if done else []])
        outputs = sched.update_from_output(out, mro)
        finish = [o.finish_reason for eco in outputs.values() for o in eco.outputs]
        steps.append((dict(out.num_scheduled_tokens), free, [str(f) for f in finish]))
    # 64-token budget: chunks of 64 and 36 (the whole 100-token prompt reserved at
    # admission: 7 blocks), then 2 decode steps; the third token ends it by length.
    assert steps == [
        ({"r0": 64}, 60, []),
        ({"r0": 36}, 57, ["None"]),
        ({"r0": 1}, 57, ["None"]),
        ({"r0": 1}, 57, ["length"]),
    ]
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 64


def test_the_engine_loop_is_vllms_engine_core_step(core):
    from engine_loop import EngineLoop
    for async_scheduling, method in ((False, "step"), (True, "step_with_batch_queue")):
        sched = vllm_core.build_scheduler(core, {**SETTINGS, "async_scheduling": async_scheduling})
        engine = EngineLoop(core.wheel, sched, lambda out: None)
        assert type(sched).__name__ == ("AsyncScheduler" if async_scheduling else "Scheduler")
        assert (engine.batch_queue is None) is (not async_scheduling)
        code = engine._methods[method].__code__
        assert code.co_filename.endswith("vllm/v1/engine/core.py") and code.co_name == method
        # Nothing to schedule: vLLM's loop returns before calling the model.
        assert engine.turn() == ((None, False, []) if async_scheduling else ({}, False, []))
