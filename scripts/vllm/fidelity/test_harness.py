"""The harness on tiny scenarios that show vLLM 0.33.0's own scheduling rules.

Every expected value below is what vLLM's Scheduler (loaded from the wheel by
vllm_core) decided; the comments say why vLLM decides so. Run:

    .venv/bin/python -m pytest -q scripts/vllm/fidelity

(needs msgspec, numpy and pytest in the venv and the wheel in target/vllm-wheel, see
conftest.py; about 2 s).
"""

import json
import subprocess
import sys

import harness
import pytest

H = {"kind": "missing"}


def settings(**kw):
    s = dict(block_size=16, num_gpu_blocks=8, max_num_seqs=4, max_num_batched_tokens=32,
             max_model_len=4096, enable_chunked_prefill=True, enable_prefix_caching=True,
             long_prefill_token_threshold=0, async_scheduling=False,
             scheduler_reserve_full_isl=True, max_steps=200)
    s.update(kw)
    return s


def req(rid, step, prompt, n_out, connector=H):
    return dict(request_id=rid, arrival_step=step, prompt_token_ids=list(prompt),
                output_token_ids=[7] * n_out, connector=connector)


def steps(core, scenario, on_step=None):
    return list(harness.run(core, scenario, on_step))


def line(step, scheduled, admitted=(), preempted=(), finished=(), skipped=(), blocks=0,
         local=(), external=None, waiting=0, running=0):
    return {"step": step, "scheduled": [list(x) for x in scheduled], "admitted": list(admitted),
            "preempted": list(preempted), "finished": list(finished),
            "skipped_pending": list(skipped), "blocks_in_use": blocks,
            "local_hits": [list(x) for x in local],
            "external_hits": [list(x) for x in (external if external is not None
                                                else [(r, 0) for r in admitted])],
            "waiting": waiting, "running": running}


# r0: 64-token prompt, 10 output tokens; r1 arrives at step 2 with an 80-token prompt.
# 8 blocks of 16 tokens, 32-token budget.
GATE = [req("r0", 0, range(1000, 1064), 10), req("r1", 2, range(2000, 2080), 4)]


def test_full_prompt_gate_refuses_a_prompt_that_does_not_fit_while_its_chunk_would(core):
    log = steps(core, {"settings": settings(), "requests": GATE})
    # Step 2: r0 decodes into its 5th block, 3 blocks are free. r1's first chunk (31
    # tokens, 2 blocks) would fit, but its whole 80-token prompt (5 blocks) does not:
    # allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl) refuses it.
    assert log[2] == line(2, [("r0", 1)], blocks=5, waiting=1, running=1)
    assert all(not entry["admitted"] for entry in log[2:11])
    # r0's last token at step 10 frees its blocks; r1 is admitted next step, and the
    # gate checks the whole prompt but allocates the chunk only (2 blocks).
    assert log[10] == line(10, [("r0", 1)], finished=["r0"], blocks=5, waiting=1, running=1)
    assert log[11] == line(11, [("r1", 32)], admitted=["r1"], blocks=2, local=[("r1", 0)],
                           running=1)
    assert not any(entry.get("preempted") for entry in log[:-1])
    assert log[-1] == {"end": True, "steps": 17, "finished": 2}


def test_without_the_gate_the_chunk_is_admitted_then_preempts_itself(core):
    log = steps(core, {"settings": settings(scheduler_reserve_full_isl=False), "requests": GATE})
    # The over-admit, preempt, re-admit loop vLLM PR #37307 closed: r1's first chunk
    # is admitted at step 2; at step 3 its next chunk needs 2 more blocks, 1 is free,
    # and the victim running.pop() is r1 itself.
    assert log[2] == line(2, [("r0", 1), ("r1", 31)], admitted=["r1"], blocks=7,
                          local=[("r1", 0)], running=2)
    assert log[3] == line(3, [("r0", 1)], preempted=["r1"], blocks=5, waiting=1, running=1)
    # Re-admitted with its first full block found in the prefix cache (16 tokens).
    assert log[4] == line(4, [("r0", 1), ("r1", 31)], admitted=["r1"], blocks=8,
                          local=[("r1", 16)], running=2)
    assert log[5]["preempted"] == ["r1"]
    assert log[-1] == {"end": True, "steps": 16, "finished": 2}


def test_preemption_takes_running_pop_and_admits_nothing_in_that_step(core):
    s = settings(num_gpu_blocks=6, max_num_batched_tokens=64)
    scenario = {"settings": s, "requests": [
        req("r0", 0, range(1000, 1032), 30), req("r1", 0, range(2000, 2032), 30),
        req("r2", 16, range(3000, 3010), 2)]}
    log = steps(core, scenario)
    assert log[0] == line(0, [("r0", 32), ("r1", 32)], admitted=["r0", "r1"], blocks=4,
                          local=[("r0", 0), ("r1", 0)], running=2)
    # Step 16: every block is held; r2 (1 block) waits.
    assert log[16] == line(16, [("r0", 1), ("r1", 1)], blocks=6, waiting=1, running=2)
    # Step 17: r0 needs its 4th block; the victim is running.pop(), r1, the most
    # recently scheduled. 2 blocks are then free and r2 would fit, but no waiting
    # request is admitted in a step that preempted.
    assert log[17] == line(17, [("r0", 1)], preempted=["r1"], blocks=4, waiting=2, running=1)
    # Step 18: r1 is back at the head of the waiting queue; its whole prompt plus its
    # 17 output tokens (4 blocks) does not fit, so neither it nor r2 behind it is
    # admitted until r0 finishes.
    assert log[18] == line(18, [("r0", 1)], blocks=4, waiting=2, running=1)
    # r1 finds 2 of its blocks again: freed blocks go back in reverse order, so r0
    # reused r1's tail block first and the prompt's blocks kept their hashes.
    assert log[30] == line(30, [("r1", 17), ("r2", 10)], admitted=["r1", "r2"], blocks=5,
                           local=[("r1", 32), ("r2", 0)], running=2)
    assert log[-1] == {"end": True, "steps": 43, "finished": 3}


def test_a_pending_connector_answer_skips_the_request_and_keeps_it_at_the_head(core):
    s = settings(max_num_seqs=2, num_gpu_blocks=64, max_num_batched_tokens=256)
    pending = {"kind": "pending", "steps": 2, "hit_tokens": 32}
    scenario = {"settings": s, "requests": [
        req("r0", 0, range(1000, 1040), 3, pending), req("r1", 0, range(2000, 2040), 2),
        req("r2", 0, range(3000, 3040), 2), req("r3", 1, range(4000, 4040), 2)]}
    order = []
    log = steps(core, scenario, lambda sched, _: order.append(
        [r.request_id for r in sched.waiting]))
    # Probe 1 answers None: r0 is skipped, r1 and r2 behind it are admitted.
    assert log[0] == line(0, [("r1", 40), ("r2", 40)], admitted=["r1", "r2"], skipped=["r0"],
                          blocks=6, local=[("r1", 0), ("r2", 0)], waiting=1, running=2)
    # Step 1: max_num_seqs is reached before the waiting queue is read: no probe.
    assert log[1] == line(1, [("r1", 1), ("r2", 1)], finished=["r1", "r2"], blocks=6,
                          waiting=2, running=2)
    # Probe 2 answers None again; r3 is admitted, r0 goes back to the head.
    assert log[2] == line(2, [("r3", 40)], admitted=["r3"], skipped=["r0"], blocks=3,
                          local=[("r3", 0)], waiting=1, running=1)
    # Probe 3 answers 32 tokens, loaded synchronously: 8 tokens are left to compute.
    assert log[3] == line(3, [("r0", 8), ("r3", 1)], admitted=["r0"], finished=["r3"],
                          blocks=6, local=[("r0", 0)], external=[("r0", 32)], running=2)
    assert order[:3] == [["r0"], ["r0", "r3"], ["r0"]]
    assert log[-1] == {"end": True, "steps": 6, "finished": 4}


def test_local_prefix_cache_hits_count_whole_16_token_blocks(core):
    base = list(range(100, 150))  # 50 tokens: 3 full blocks and 2 tokens
    scenario = {"settings": settings(num_gpu_blocks=64, max_num_batched_tokens=256),
                "requests": [
                    req("r0", 0, base, 1),
                    req("r1", 2, base[:40] + list(range(900, 910)), 1),  # differs in block 3
                    req("r2", 2, base + list(range(900, 920)), 1),  # extends r0's prompt
                    req("r3", 2, base, 1),  # the same prompt
                    req("r4", 2, base[:48], 1),  # exactly r0's 3 full blocks
                    req("r5", 2, base[:15], 1)]}  # shorter than a block
    log = steps(core, scenario)
    assert log[0]["finished"] == ["r0"]
    # r4's 48 tokens are all cached, but the last token is recomputed to sample from,
    # so its hit stops one block short (max_cache_hit_length = num_tokens - 1).
    assert log[2] == line(2, [("r1", 18), ("r2", 22), ("r3", 2), ("r4", 16)],
                          admitted=["r1", "r2", "r3", "r4"], finished=["r1", "r2", "r3", "r4"],
                          blocks=9, local=[("r1", 32), ("r2", 48), ("r3", 48), ("r4", 32)],
                          waiting=1, running=4)
    assert log[3] == line(3, [("r5", 15)], admitted=["r5"], finished=["r5"], blocks=1,
                          local=[("r5", 0)], running=1)


def test_a_ready_hit_covering_the_whole_prompt_is_cut_below_its_last_token(core):
    scenario = {"settings": settings(num_gpu_blocks=64), "requests": [
        req("r0", 0, range(1000, 1032), 1, {"kind": "ready", "hit_tokens": 32}),
        req("r1", 0, range(2000, 2010), 1, {"kind": "ready", "hit_tokens": 16})]}
    log = steps(core, scenario)
    # r0: 32 of 32 tokens would be a full hit; vLLM's Mooncake lookup re-derives it
    # below the request end (16). r1 is shorter than a block: never probed, 0.
    assert log[0] == line(0, [("r0", 16), ("r1", 10)], admitted=["r0", "r1"],
                          finished=["r0", "r1"], blocks=3, local=[("r0", 0), ("r1", 0)],
                          external=[("r0", 16), ("r1", 0)], running=2)


def test_async_scheduling_schedules_a_step_before_the_last_output_is_processed(core):
    # vLLM 0.33's default for one GPU (async_scheduling None -> True): AsyncScheduler
    # in EngineCore.step_with_batch_queue with 2 batches in flight.
    scenario = {"settings": settings(num_gpu_blocks=64, async_scheduling=True), "requests": [
        req("r0", 0, range(1000, 1040), 3), req("r1", 1, range(2000, 2020), 2)]}
    log = steps(core, scenario)
    assert log[0] == line(0, [("r0", 32)], admitted=["r0"], blocks=2, local=[("r0", 0)],
                          running=1)
    # r0's second chunk is scheduled before step 0's output is processed.
    assert log[1] == line(1, [("r0", 8), ("r1", 20)], admitted=["r1"], blocks=5,
                          local=[("r1", 0)], running=2)
    assert log[2] == line(2, [("r0", 1), ("r1", 1)], blocks=5, running=2)
    # r1's 2 tokens are delivered or in flight: it is not scheduled again, and its
    # finish is seen when step 2's output is processed, during step 3.
    assert log[3] == line(3, [("r0", 1)], finished=["r1"], blocks=5, running=2)
    assert log[4] == line(4, [], finished=["r0"], blocks=3, running=1)
    assert log[-1] == {"end": True, "steps": 5, "finished": 2}
    # The same scenario without async scheduling: each step sees its own output.
    sync = steps(core, {**scenario, "settings": settings(num_gpu_blocks=64)})
    assert [x["finished"] for x in sync[:-1]] == [[], [], ["r1"], ["r0"]]


def test_an_output_past_max_model_len_is_cut_there_by_vllm(core):
    # 64 prompt tokens, 10 listed outputs, max_model_len 70: check_stop finishes the
    # request when it holds 70 tokens, after 6 outputs.
    scenario = {"settings": settings(max_model_len=70), "requests": [req("r0", 0, range(64), 10)]}
    log = steps(core, scenario)
    assert log[-1] == {"end": True, "steps": 7, "finished": 1}
    assert log[6]["finished"] == ["r0"]


def test_the_same_scenario_gives_the_same_log(core):
    scenario = {"settings": settings(scheduler_reserve_full_isl=False), "requests": GATE}
    assert steps(core, scenario) == steps(core, scenario)


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["settings"].pop("num_gpu_blocks"), "settings.num_gpu_blocks is missing"),
    (lambda s: s["settings"].update(async_scheduling=1), "async_scheduling must be bool"),
    (lambda s: s["requests"][0]["connector"].update(kind="later"), "connector.kind"),
    (lambda s: s["requests"][0]["connector"].update(kind="ready", hit_tokens=17),
     "multiple of 16"),
    (lambda s: s["requests"][0].update(prompt_token_ids=[-1]), "prompt_token_ids"),
    (lambda s: s["requests"].append(dict(s["requests"][0])), "unique"),
    (lambda s: s["requests"].append("r9"), r"requests\[2\] must be an object"),
    (lambda s: s["settings"].update(max_model_len=80), r"requests\[1\]: the prompt \(length 80\)"),
    # vLLM's own SchedulerConfig check (verify_max_model_len).
    (lambda s: s["settings"].update(max_num_seqs=64), r"must be greater than or equal to "
     r"max_num_seqs \(64\)"),
])
def test_a_bad_scenario_names_the_field(core, mutate, message):
    scenario = json.loads(json.dumps({"settings": settings(), "requests": GATE}))
    mutate(scenario)
    with pytest.raises(harness.ScenarioError, match=message):
        steps(core, scenario)


def test_the_command_writes_the_log_and_exits_2_on_a_bad_scenario(wheel, tmp_path):
    good = tmp_path / "in.json"
    good.write_text(json.dumps({"settings": settings(), "requests": GATE}))
    out = tmp_path / "steps.jsonl"
    cmd = [sys.executable, harness.__file__, "--wheel", wheel, "--out", str(out)]
    done = subprocess.run([*cmd, "--scenario", str(good)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 18 and lines[-1] == {"end": True, "steps": 17, "finished": 2}
    assert list(lines[0]) == ["step", "scheduled", "admitted", "preempted", "finished",
                              "skipped_pending", "blocks_in_use", "local_hits",
                              "external_hits", "waiting", "running"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"settings": {}, "requests": []}))
    done = subprocess.run([*cmd, "--scenario", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "settings.block_size is missing" in done.stderr
    bad.write_text('{"settings": ')
    done = subprocess.run([*cmd, "--scenario", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2 and "not JSON" in done.stderr


def test_a_generated_scenario_runs_to_the_end(core):
    import gen_scenario
    scenario = gen_scenario.scenario(12, 0)
    assert scenario == gen_scenario.scenario(12, 0)
    log = steps(core, scenario)
    assert log[-1] == {"end": True, "steps": 301, "finished": 12}
    assert sum(len(x.get("skipped_pending", ())) for x in log) == 3


# r0: a 50-token prompt whose first 48 tokens are stored; the connector loads them
# asynchronously for 2 model-runner steps (load_kv_async True).
LOAD = [req("r0", 0, range(1000, 1050), 2, {"kind": "ready", "hit_tokens": 48, "load_steps": 2})]


@pytest.mark.parametrize("async_scheduling,admitted_at", [(False, 2), (True, 3)])
def test_an_async_load_holds_its_blocks_until_its_output_reports_it(core, async_scheduling,
                                                                    admitted_at):
    log = steps(core, {"settings": settings(async_scheduling=async_scheduling),
                       "requests": LOAD})
    # Step 0: its 3 blocks are allocated for the load (WAITING_FOR_REMOTE_KVS), nothing
    # is scheduled. The load ends in the output of the 2nd step run (step 1), which a
    # schedule sees at step 2, at step 3 with async scheduling (that output is
    # processed after step 2's schedule). Admitted then, it computes its last 2 tokens
    # (hits are reported for admissions: none at that admission).
    for s in range(admitted_at):
        assert log[s] == line(s, [], blocks=3, waiting=1)
    assert log[admitted_at] == line(admitted_at, [("r0", 2)], admitted=["r0"], blocks=4,
                                    local=[("r0", 0)], running=1)
