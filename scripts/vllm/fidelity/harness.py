"""Runs vLLM 0.33.0's own Scheduler on a fidelity scenario and writes its step log.

    python3 harness.py --wheel vllm-0.33.0-*.whl --scenario in.json --out vllm_steps.jsonl
        [--show N]

The scenario and step-log formats are those of issue 34 item 1 (written by
`cargo xtask fidelity --against vllm`, xtask/src/fidelity/). Per step: the requests
whose `arrival_step` is this step are added (`add_request`, in file order), then one
turn of vLLM's engine loop: `schedule()`, the stand-in model runner's output, and
`update_from_output()` (see `run` for async scheduling); one JSON line is written.
The run ends when every request has finished or after `max_steps` steps; the last
line is {"end": true, "steps": N, "finished": M}.
Deterministic: the same scenario gives the same bytes.

vLLM's code is loaded by vllm_core (scheduler, KV cache manager, block pool,
coordinator, request: the wheel's own). The harness adds only:
- `ScenarioConnector`, a scheduler-role KV connector (a subclass of vLLM's own
  KVConnectorBase_V1) answering `get_num_new_matched_tokens` from the scenario:
  missing -> (0, False); ready N -> hit N; pending K, N -> (None, False) for the
  first K probes of the request (counted across preemptions), then hit N. A hit is
  clamped as vLLM's MooncakeStoreConnector and its lookup do
  (mooncake/store/scheduler.py get_num_new_matched_tokens, worker.py lookup): no
  probe for a request shorter than one block; the hit is cut to whole blocks below
  the request's length when it would cover every token; the answer is the hit minus
  the block-aligned local hit, 0 if negative. Loads are synchronous
  (load_kv_async False) unless the answer carries `load_steps` K: then a hit above 0
  loads asynchronously (load_kv_async True: vLLM allocates its blocks and parks it in
  WAITING_FOR_REMOTE_KVS), and the model runner reports it in
  `KVConnectorOutput.finished_recving` of the K-th step it runs from the one that
  allocated it (that one included).
- a model runner: each scheduled request that is not a partial prefill after this
  step (vLLM's `Request.is_prefill_chunk`) samples its next token from the scenario's
  `output_token_ids`; max_tokens = len(output_token_ids), so vLLM finishes it
  (FINISHED_LENGTH_CAPPED) with its last token.
- observation hooks that record, without changing them, the calls to
  `Scheduler._preempt_request` (preemption order),
  `KVCacheManager.record_prefix_cache_stats` (the local hit of each admission) and
  the connector's `get_num_new_matched_tokens` (None answers) and
  `update_state_after_alloc` (external tokens).

Where this differs from the interchange format's words (vLLM's rule is followed):
- the format samples when num_computed_tokens + scheduled tokens reaches the prompt
  length; vLLM samples when they reach the request's length, prompt plus the output
  tokens it already has, so a preempted request samples again only once its
  recomputation covers its earlier output (`is_prefill_chunk`, scheduler.py line 1863);
- the format calls `async_scheduling: false` vLLM 0.33's setting; it is not (below);
- a prompt of max_model_len tokens or more is a bad scenario (vLLM's input processor
  refuses it); a shorter one whose output would pass max_model_len is run, and vLLM
  finishes it when it reaches max_model_len tokens (sched/utils.py check_stop), with
  fewer output tokens than the scenario lists.

Choices the interchange format leaves open (the Rust side must make the same):
- a step is logged for every turn from step 0, also when nothing is scheduled
  (before the first arrival, or while every waiting request is pending); a turn
  with no request in the scheduler does not call schedule() (vLLM's has_requests());
- blocks_in_use, waiting and running are read right after schedule(), before the
  model output is processed; a turn that schedules nothing reports its starting state;
- "finished" is sorted by request id (string order), as "scheduled" is;
- "waiting" counts vLLM's `waiting` and `kv_holding_waiting` queues (the second is
  always empty with synchronous loads);
- a request whose prompt is shorter than block_size is never probed (vLLM's
  connector answers (0, False) without a lookup), so its pending probes never count.
Async scheduling: `async_scheduling` true runs vLLM's AsyncScheduler in vLLM's own
EngineCore.step_with_batch_queue (engine_loop.py; 2 batches in flight: a step
schedules batch k, then processes batch k - 1's output, so "finished" lags a step),
with max_concurrent_batches 2, which makes the scheduler defer block frees of a KV
consumer (kv_both here). vLLM 0.33 itself resolves `async_scheduling` None to True
for a generate model on the uniproc or multiproc executor without pipeline
parallelism (config/vllm.py lines 1685-1719), a connector or not: the format's
`false` is not what vLLM 0.33 picks by default for one GPU.
"""

import argparse
import json
import logging
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import vllm_core  # noqa: E402
from engine_loop import EngineLoop  # noqa: E402

SETTING_KEYS = {
    "block_size": int, "num_gpu_blocks": int, "max_num_seqs": int,
    "max_num_batched_tokens": int, "max_model_len": int, "enable_chunked_prefill": bool,
    "enable_prefix_caching": bool, "long_prefill_token_threshold": int,
    "async_scheduling": bool, "scheduler_reserve_full_isl": bool, "max_steps": int,
}


class ScenarioError(ValueError):
    """The scenario file is malformed: the message names the field."""


def validate(scenario):
    """Checks the scenario's shape and values; raises ScenarioError naming the field."""
    if not isinstance(scenario, dict) or "settings" not in scenario or "requests" not in scenario:
        raise ScenarioError("the scenario must be an object with 'settings' and 'requests'")
    s = scenario["settings"]
    if not isinstance(s, dict) or not isinstance(scenario["requests"], list):
        raise ScenarioError("'settings' must be an object and 'requests' a list")
    for k, t in SETTING_KEYS.items():
        if k not in s:
            if k == "scheduler_reserve_full_isl":
                continue  # vLLM's default (True) applies
            raise ScenarioError(f"settings.{k} is missing")
        if type(s[k]) is not t:
            raise ScenarioError(f"settings.{k} must be {t.__name__}, got {s[k]!r}")
    for k in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens",
              "max_model_len"):
        if s[k] <= 0:
            raise ScenarioError(f"settings.{k} must be positive, got {s[k]}")
    bs, seen = s["block_size"], set()
    for i, r in enumerate(scenario["requests"]):
        where = f"requests[{i}]"
        if not isinstance(r, dict):
            raise ScenarioError(f"{where} must be an object")
        for k in ("request_id", "arrival_step", "prompt_token_ids", "output_token_ids",
                  "connector"):
            if k not in r:
                raise ScenarioError(f"{where}.{k} is missing")
        rid = r["request_id"]
        if not isinstance(rid, str) or rid in seen:
            raise ScenarioError(f"{where}.request_id must be a unique string, got {rid!r}")
        seen.add(rid)
        if type(r["arrival_step"]) is not int or r["arrival_step"] < 0:
            raise ScenarioError(f"{where}.arrival_step must be an int >= 0")
        for k, least in (("prompt_token_ids", 1), ("output_token_ids", 1)):
            toks = r[k]
            if not isinstance(toks, list) or len(toks) < least or not all(
                    type(t) is int and 0 <= t < 2**31 for t in toks):
                raise ScenarioError(f"{where}.{k} must be a non-empty list of ints in [0, 2^31)")
        if len(r["prompt_token_ids"]) >= s["max_model_len"]:
            # vLLM's input processor rejects it before the scheduler
            # (v1/engine/input_processor.py _validate_prompt_len).
            raise ScenarioError(
                f"{where}: the prompt (length {len(r['prompt_token_ids'])}) plus at least one "
                f"output token is longer than settings.max_model_len {s['max_model_len']}")
        c = r["connector"]
        kind = c.get("kind") if isinstance(c, dict) else None
        if kind not in ("missing", "ready", "pending"):
            raise ScenarioError(f"{where}.connector.kind must be missing, ready or pending")
        if kind in ("ready", "pending"):
            n = c.get("hit_tokens")
            if type(n) is not int or n < 0 or n % bs:
                raise ScenarioError(f"{where}.connector.hit_tokens must be a multiple of "
                                    f"{bs} >= 0, got {n!r}")
        if kind == "pending" and (type(c.get("steps")) is not int or c["steps"] < 0):
            raise ScenarioError(f"{where}.connector.steps must be an int >= 0")
        if "load_steps" in c and (kind == "missing" or type(c["load_steps"]) is not int
                                  or c["load_steps"] < 1):
            raise ScenarioError(f"{where}.connector.load_steps must be an int >= 1, "
                                f"with kind ready or pending")


def make_connector_class(core):
    """`ScenarioConnector`: vLLM's KVConnectorBase_V1 with the scheduler-side answers
    of the scenario (see the module docstring)."""

    class ScenarioConnector(core.KVConnectorBase_V1):
        def __init__(self, vllm_config, role, kv_cache_config, answers, block_size):
            super().__init__(vllm_config, role, kv_cache_config)
            self.answers = answers  # request id -> connector dict of the scenario
            self.block_size = block_size
            self.probes = {}  # request id -> probes answered so far
            self.loading = {}  # request id -> model-runner steps left of its async load

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            bs = self.block_size
            if request.num_tokens < bs:
                return 0, False
            rid = request.request_id
            answer = self.answers[rid]
            n = self.probes.get(rid, 0)
            self.probes[rid] = n + 1
            if answer["kind"] == "missing":
                return 0, False
            if answer["kind"] == "pending" and n < answer["steps"]:
                return None, False
            hit = min(answer["hit_tokens"], request.num_tokens // bs * bs)
            if hit >= request.num_tokens:
                hit = min(hit, (request.num_tokens - 1) // bs * bs)
            ext = max(0, hit - num_computed_tokens)
            return ext, ext > 0 and "load_steps" in answer

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            # An async load starts with its blocks: it ends in the output of the
            # load_steps-th model-runner step from this one (this one included).
            answer = self.answers[request.request_id]
            if num_external_tokens > 0 and "load_steps" in answer:
                self.loading[request.request_id] = answer["load_steps"]

        def loads_done(self):
            """One model-runner step: the requests whose async load ends in its
            output (`KVConnectorOutput.finished_recving`)."""
            done = set()
            for rid in list(self.loading):
                self.loading[rid] -= 1
                if self.loading[rid] == 0:
                    del self.loading[rid]
                    done.add(rid)
            return done

        def build_connector_meta(self, scheduler_output):
            return core.KVConnectorMetadata()

        # Worker side: never called on the scheduler.
        def start_load_kv(self, forward_context, **kwargs):
            raise NotImplementedError("scheduler role only")

        def wait_for_layer_load(self, layer_name):
            raise NotImplementedError("scheduler role only")

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            raise NotImplementedError("scheduler role only")

        def wait_for_save(self):
            raise NotImplementedError("scheduler role only")

    return ScenarioConnector


def settings_with_defaults(core, s):
    """The scenario's settings, with vLLM's default for `scheduler_reserve_full_isl`
    when the scenario leaves it out."""
    out = dict(s)
    out.setdefault("scheduler_reserve_full_isl",
                   core.config_defaults["SchedulerConfig"]["scheduler_reserve_full_isl"])
    return out


class Observer:
    """Records, without changing them, the calls that the step log reports: the
    preemption order (`Scheduler._preempt_request`), each admission's local hit
    (`KVCacheManager.record_prefix_cache_stats`), the connector's None answers
    (`get_num_new_matched_tokens`) and external tokens (`update_state_after_alloc`);
    all still run unchanged."""

    def __init__(self, sched):
        self.preempted, self.local_hits, self.skipped, self.external = [], {}, [], {}
        connector = sched.connector
        real_probe = connector.get_num_new_matched_tokens
        real_alloc = connector.update_state_after_alloc

        def probe_hook(request, num_computed_tokens):
            answer = real_probe(request, num_computed_tokens)
            if answer[0] is None:
                self.skipped.append(request.request_id)
            return answer

        def alloc_hook(request, blocks, num_external_tokens):
            self.external[request.request_id] = num_external_tokens
            return real_alloc(request, blocks, num_external_tokens)
        connector.get_num_new_matched_tokens = probe_hook
        connector.update_state_after_alloc = alloc_hook
        real_preempt = sched._preempt_request
        manager = sched.kv_cache_manager
        real_record = manager.record_prefix_cache_stats

        def preempt_hook(request, *args, **kwargs):
            self.preempted.append(request.request_id)
            return real_preempt(request, *args, **kwargs)

        def record_hook(request, num_new_local_computed_tokens, *args, **kwargs):
            self.local_hits[request.request_id] = num_new_local_computed_tokens
            return real_record(request, num_new_local_computed_tokens, *args, **kwargs)
        sched._preempt_request = preempt_hook
        manager.record_prefix_cache_stats = record_hook

    def clear(self):
        self.preempted.clear()
        self.local_hits.clear()
        self.skipped.clear()
        self.external.clear()


def model_output(core, sched, out, outputs):
    """The stand-in model runner's ModelRunnerOutput for the SchedulerOutput `out`:
    one sampled token per request past its prefill (`not is_prefill_chunk`), the next
    of `outputs[request id]`. Its index counts the tokens delivered and those still in
    flight (AsyncScheduler's `num_output_placeholders`, this step's included); an
    index past the end (a step vLLM schedules before it sees the length cap) repeats
    the last token, which vLLM discards."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        if req.is_prefill_chunk:
            sampled.append([])
            continue
        index = req.num_output_tokens + max(req.num_output_placeholders - 1, 0)
        sampled.append([outputs[rid][min(index, len(outputs[rid]) - 1)]])
    loads_done = getattr(sched.connector, "loads_done", None)
    done = loads_done() if loads_done is not None else set()
    kv_out = core.KVConnectorOutput(finished_recving=done) if done else None
    return core.ModelRunnerOutput(req_ids=ids, req_id_to_index={k: i for i, k in enumerate(ids)},
                                  sampled_token_ids=sampled, kv_connector_output=kv_out)


def run(core, scenario, on_step=None, connector=None, kv_transfer=None):
    """Yields the step log's objects (dicts), then the end line. `scenario`: the parsed
    JSON (validated here). `on_step(scheduler, line)`, if given, sees vLLM's Scheduler
    after each step (tests read its queues). `connector` (with `kv_transfer`, see
    vllm_core.build_scheduler) replaces ScenarioConnector, for example with vLLM's own
    MooncakeStoreConnector; the scenario's connector answers are then not used.

    Each step is one turn of vLLM's own engine loop (engine_loop.EngineLoop, the
    wheel's EngineCore.step or, with async scheduling, step_with_batch_queue over 2
    batches: a step schedules batch k and then processes batch k - 1's output, step
    0 none). A turn with no request in the scheduler schedules nothing (vLLM's
    `has_requests()` gate)."""
    validate(scenario)
    s = settings_with_defaults(core, scenario["settings"])
    reqs = scenario["requests"]
    answers = {r["request_id"]: r["connector"] for r in reqs}
    outputs = {r["request_id"]: r["output_token_ids"] for r in reqs}
    if connector is None:
        cls = make_connector_class(core)

        def connector(vllm_config, role, kv_cache_config):
            return cls(vllm_config, role, kv_cache_config, answers, s["block_size"])
    try:
        sched = vllm_core.build_scheduler(core, s, connector=connector, kv_transfer=kv_transfer)
    except ValueError as e:  # vLLM's SchedulerConfig.verify_max_model_len
        raise ScenarioError(f"vLLM's SchedulerConfig refuses the settings: {e}") from e
    observer = Observer(sched)
    pool = sched.kv_cache_manager.block_pool
    after_schedule = {}

    def state(running_before):
        """The step line's fields read right after schedule() (before the model output
        is processed, which frees the blocks of requests it finishes)."""
        admitted = [r.request_id for r in sched.running if id(r) not in running_before]
        return {
            "admitted": admitted,
            "blocks_in_use": s["num_gpu_blocks"] - pool.get_num_free_blocks(),
            "local_hits": [[rid, observer.local_hits.get(rid, 0)] for rid in admitted],
            "external_hits": [[rid, observer.external.get(rid, 0)] for rid in admitted],
            "waiting": len(sched.waiting) + len(sched.kv_holding_waiting),
            "running": len(sched.running),
        }

    def run_model(out):
        after_schedule.update(state(after_schedule["running_before"]))
        return model_output(core, sched, out, outputs)

    engine = EngineLoop(core.wheel, sched, run_model)
    arrivals = {}
    for r in reqs:
        arrivals.setdefault(r["arrival_step"], []).append(r)
    finished_total, step = 0, 0
    while step < s["max_steps"] and finished_total < len(reqs):
        for r in arrivals.pop(step, []):
            sched.add_request(vllm_core.make_request(
                core, r["request_id"], r["prompt_token_ids"], len(r["output_token_ids"]),
                s["block_size"], arrival_time=float(r["arrival_step"])))
        running_before = {id(r) for r in sched.running}
        observer.clear()
        # A turn that schedules nothing reports the state it started from.
        after_schedule.clear()
        after_schedule.update(state(running_before), running_before=running_before)
        engine_outputs, _, scheduled_outputs = engine.turn()
        scheduled = dict(scheduled_outputs[-1].num_scheduled_tokens) if scheduled_outputs else {}
        st = after_schedule
        line = {
            "step": step,
            "scheduled": sorted([k, v] for k, v in scheduled.items()),
            "admitted": st["admitted"],
            "preempted": list(observer.preempted),
            "finished": [],
            "skipped_pending": list(observer.skipped),
            "blocks_in_use": st["blocks_in_use"],
            "local_hits": st["local_hits"],
            "external_hits": st["external_hits"],
            "waiting": st["waiting"],
            "running": st["running"],
        }
        line["finished"] = sorted(o.request_id for eco in (engine_outputs or {}).values()
                                  for o in eco.outputs if o.finish_reason is not None)
        finished_total += len(line["finished"])
        if on_step is not None:
            on_step(sched, line)
        yield line
        step += 1
    sched.shutdown()  # as EngineCore.shutdown does
    yield {"end": True, "steps": step, "finished": finished_total}


def show(line):
    """One step, human-readable (for --show)."""
    if line.get("end"):
        return f"end: {line['steps']} steps, {line['finished']} finished"
    sched = " ".join(f"{r}:{n}" for r, n in line["scheduled"]) or "-"
    parts = [f"step {line['step']:>4}  blocks {line['blocks_in_use']:>5}  "
             f"waiting {line['waiting']:>3}  running {line['running']:>3}  sched {sched}"]
    for key in ("admitted", "preempted", "finished", "skipped_pending"):
        if line[key]:
            parts.append(f"    {key}: {' '.join(line[key])}")
    if line["admitted"]:
        hits = " ".join(f"{r}:{lh}+{eh}" for (r, lh), (_, eh) in
                        zip(line["local_hits"], line["external_hits"], strict=True))
        parts.append(f"    hits (local+external tokens): {hits}")
    return "\n".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", required=True, help="path of vllm-0.33.0-*.whl")
    p.add_argument("--scenario", required=True, help="scenario JSON file")
    p.add_argument("--out", help="step log to write (JSON Lines)")
    p.add_argument("--show", type=int, default=0, metavar="N",
                   help="print the first N steps human-readably on stderr")
    p.add_argument("--verbose", action="store_true", help="print vLLM's log lines")
    a = p.parse_args(argv)
    # vLLM's connector base warns that its API is experimental at every start.
    logging.basicConfig(level=logging.INFO if a.verbose else logging.ERROR,
                        format="%(levelname)s %(name)s: %(message)s")
    if not a.out and not a.show:
        p.error("give --out, --show or both")
    stage = "reading the scenario"
    try:
        with open(a.scenario) as f:
            try:
                scenario = json.load(f)
            except json.JSONDecodeError as e:
                raise ScenarioError(f"not JSON: {e}") from e
        stage = "loading vLLM 0.33.0's scheduler from the wheel"
        core = vllm_core.load(a.wheel)
        stage = "running the scenario"
        t0 = time.perf_counter()
        out = open(a.out, "w") if a.out else None
        try:
            for line in run(core, scenario):
                if out:
                    out.write(json.dumps(line, separators=(",", ":")) + "\n")
                if a.show and (line.get("end") or line["step"] < a.show):
                    print(show(line), file=sys.stderr)
                elif a.show and not a.out:
                    break
        finally:
            if out:
                out.close()
        ran = line["steps"] if line.get("end") else line["step"]
        print(f"harness: {ran} steps in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    except ScenarioError as e:
        print(f"harness: bad scenario {a.scenario}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - any failure names its stage
        traceback.print_exc()
        print(f"harness: failed while {stage}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
