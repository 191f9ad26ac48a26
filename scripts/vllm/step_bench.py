"""What a scheduler step pays for its lookups, in vLLM 0.33.0's own loop, on CPU.

vLLM's own Scheduler, KVCacheManager and BlockPool (scripts/vllm/fidelity/vllm_core.py,
from the wheel) run one engine step at a time (fidelity/engine_loop.py: the wheel's
EngineCore.step, with a stand-in model runner that samples one token per request past
its prefill), with one of these scheduler-side KV connectors, all real classes:

- `vllm_sync`: vLLM's MooncakeStoreConnector with its own LookupKeyClient,
  `lookup_async` false (each probe waits for its round trip);
- `vllm_async`: the same, `lookup_async` true (a probe submits to the client's one
  executor thread and polls its future);
- `drop_in`: mooncake_lookup.vllm's MooncakeLookupConnector (vLLM's connector with the
  drop-in client, prefetch at arrival);
- `floor` (only when named in `--clients`): the same connector with a lookup client
  that costs nothing (every lookup answers at once with the miss it would get; its
  other calls do nothing, as Python functions: a frame each where the drop-in's are
  native methods). Its time is the connector's own code, vLLM's bookkeeping and the
  drop-in's hooks around it: about the least a lookup client of this connector can
  cost the step, against which its ratios to vLLM's clients are read.

All ask one `lookup-server` (the project's, release) whose index answers every call
after `--delays-us` (a thread's sleep: `--index-delay-us`); the store is empty, so
every lookup is a miss and no KV is loaded. The connectors are consumers (`--kv-role
kv_consumer`: lookups and loads); `--kv-role kv_both` makes them producers too, whose
build also walks the running batch and pins each prompt's blocks for its save (the
stand-in worker reports every save done at once). Prompts are 64 blocks of 16 tokens, each
request's own tokens; every request samples `--max-tokens` tokens. Between two steps
the loop sleeps `--forward-ms` (the model's forward pass), during which lookups go on.
Before each run's steps the Python heap is collected and frozen (`gc.freeze`), as
vLLM's EngineCore does after its startup (the requests made ahead are frozen with it,
where vLLM's would be made after its freeze: the same for every client).

Per step it times the scheduler thread's time inside the connector's hooks (every
method the scheduler calls on it: on_new_request in add_request,
get_num_new_matched_tokens, update_state_after_alloc, build_connector_meta,
request_finished, ...; nested calls counted once) and the step itself (the step's
add_request calls plus one EngineCore.step), each with time.perf_counter_ns.

Workloads, per queue length Q of `--queues`:
- `steady`: Q requests wait at every step (each step tops the queue up to Q before it
  runs: arrivals at the rate the scheduler admits); `--warmup-steps` steps unmeasured,
  then `--steps` measured;
- `burst`: Q requests arrive in one step, into an empty scheduler; every step until
  the queue is empty is measured (at most `--burst-steps`).

With `--breakdown`, each run also has, per step, `hook_ns` (each hook's time),
`client_ns` and `call_ns` (the time inside the lookup client's own methods, vLLM's or
the drop-in's, per method, with call counts and the step's first call) and
`conn_cpu_ns` (the scheduler thread's CPU time in the hooks, `time.thread_time_ns`,
itself a system call per hook); the summary splits the hooks' time into the client's
and the rest (vLLM's shared connector code), and a second table goes to stderr. It
also gives, per run, vLLM's connector bookkeeping (`build_connector_meta`,
`update_state_after_alloc`, `request_finished`, without the client calls inside
them: code every client runs) and the steps where it alone is above a fifth or a third
of that run's step: read on vLLM's async client, the steps where no client could be
5x or 3x cheaper than it. The
wrappers cost a Python frame per client call: the headline figures are taken without.

With `--reps R`, each (delay, workload, queue) runs R times, the clients in turn
within each repetition (so a load spike on the machine meets the clients of one
repetition alike); the ratios are paired per repetition and reported as median
[min-max] over the R: the figure to read, since single runs move by up to 2x on a
busy 2-core machine.

Prints one JSON object: {"settings": {...}, "runs": [{client, delay_us, workload,
queue, rep, conn_ns: [...], step_ns: [...], waiting: [...]}, ...], "summary": [...],
"ratios": [...]}, and a table on stderr.

Usage: step_bench.py --wheel VLLM_WHEEL --lookup-server PATH [--queues 32,256,1024]
       [--delays-us 100,500] [--clients vllm_sync,vllm_async,drop_in] [--reps 1]
       [--kv-role kv_consumer|kv_both] [--breakdown]
scripts/vllm/step_bench.sh builds what it needs and runs it.
"""

import argparse
import gc
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fidelity"))

import mooncake_store  # noqa: E402
import vllm_core  # noqa: E402
from engine_loop import EngineLoop  # noqa: E402

BLOCK = 16
BLOCKS = 64
CLIENTS = ("vllm_sync", "vllm_async", "drop_in")
# Clients that `--clients` may add: `floor`, the drop-in's connector with a lookup
# client that costs nothing (FloorClient).
EXTRA_CLIENTS = ("floor",)
# The clients whose ratios to vLLM's are reported.
OURS = ("drop_in", "floor")
# Every scheduler-side method vLLM 0.33's Scheduler calls on its connector.
HOOKS = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc",
         "build_connector_meta", "request_finished", "request_finished_all_groups",
         "update_connector_output", "take_events", "has_pending_block_frees",
         "get_loaded_kv_cache_group_ids", "get_external_cache_hit_sources",
         "get_kv_connector_stats", "has_pending_push_work", "register_finished_partial_tail",
         "get_finished_count")
# The hooks that are vLLM's connector bookkeeping rather than lookups: every client
# runs them (`breakdown`'s floor).
BOOKKEEPING = ("build_connector_meta", "update_state_after_alloc", "request_finished",
               "request_finished_all_groups")
# The lookup client's methods the scheduler side calls (vLLM's client: lookup,
# discard, reset; the drop-in adds the prefetch calls).
CLIENT_CALLS = ("lookup", "discard", "prefetch", "flush", "on_allocated", "on_preempted",
                "prefetch_many", "step_done")


def pct(values, q):
    """Nearest rank: index round(q * (n - 1)) of the sorted values (the bench's rule)."""
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] if v else 0


class HookClock:
    """The scheduler thread's time inside the connector's hooks since `take()`.

    With `breakdown`, also per hook (the outermost hook a nanosecond is spent in) and
    inside the lookup client's own methods (`CLIENT_CALLS` on the scheduler's
    `client`, vLLM's or the drop-in), so that a hook's time splits into lookup work
    and vLLM's shared metadata code. The client wrappers cost one Python frame per
    call: the headline figures are taken without `breakdown`."""

    def __init__(self, connector, breakdown=False):
        self.ns, self.depth, self.calls = 0, 0, 0
        self.by_hook, self.client_ns, self.by_call, self.cpu_ns = {}, 0, {}, 0
        clock = time.perf_counter_ns
        cpu = time.thread_time_ns
        for name in HOOKS:
            orig = getattr(connector, name, None)
            if orig is None:
                continue

            def timed(*a, _orig=orig, _name=name, **k):
                if self.depth:
                    return _orig(*a, **k)
                self.depth += 1
                c0 = cpu() if breakdown else 0
                t0 = clock()
                try:
                    return _orig(*a, **k)
                finally:
                    dt = clock() - t0
                    self.ns += dt
                    if breakdown:
                        self.cpu_ns += cpu() - c0
                        self.by_hook[_name] = self.by_hook.get(_name, 0) + dt
                    self.depth -= 1
                    self.calls += 1

            setattr(connector, name, timed)
        sched = getattr(connector, "connector_scheduler", None)
        client = getattr(sched, "client", None)
        if not breakdown or client is None:
            return
        for name in CLIENT_CALLS:
            orig = getattr(client, name, None)
            if orig is None:
                continue

            def timed_call(*a, _orig=orig, _name=name, **k):
                t0 = clock()
                try:
                    return _orig(*a, **k)
                finally:
                    dt = clock() - t0
                    self.client_ns += dt
                    if not self.by_call:
                        # The step's first client call: it applies what the I/O
                        # thread reported since the last step (the drop-in).
                        self.by_call["first_call"] = dt
                    self.by_call[_name] = self.by_call.get(_name, 0) + dt
                    self.by_call["n_" + _name] = self.by_call.get("n_" + _name, 0) + 1

            setattr(client, name, timed_call)
        # The drop-in's arrivals call the client's prefetch through a reference taken
        # at its construction: pointed at the timed one.
        prefetch = getattr(connector, "lookup_prefetch", None)
        if prefetch is not None and hasattr(prefetch, "_prefetch"):
            prefetch._prefetch = client.prefetch

    def take(self):
        ns, self.ns = self.ns, 0
        return ns

    def take_breakdown(self):
        """({hook: ns}, client ns, {client method: ns}, the hooks' thread CPU ns)
        since the last call."""
        got = (self.by_hook, self.client_ns, self.by_call, self.cpu_ns)
        self.by_hook, self.client_ns, self.by_call, self.cpu_ns = {}, 0, {}, 0
        return got


def settings(args, queue):
    """The scheduler's settings: room for every running request, 8 prompts per step."""
    return {
        "block_size": BLOCK, "num_gpu_blocks": args.gpu_blocks, "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens, "max_model_len": 4096,
        "enable_chunked_prefill": True, "enable_prefix_caching": True,
        "long_prefill_token_threshold": 0, "async_scheduling": False,
        "scheduler_reserve_full_isl": True,
    }


def model_output(core, sched, out):
    """One sampled token per scheduled request past its prefill (token 7). Under a
    producer, the one worker (world size 1) also reports every store job of the step's
    metadata done (vLLM's MooncakeStoreWorkerMetadata), as a worker does once its
    saves are written (each of the world's workers, counted at once): the scheduler
    drops the job's block references then, and the
    KV cache does not fill with blocks pinned for saves."""
    ids = list(out.num_scheduled_tokens)
    sampled = [[] if sched.requests[rid].is_prefill_chunk else [7] for rid in ids]
    kv_out = None
    meta = getattr(out, "kv_connector_metadata", None)
    workers = sched.vllm_config.parallel_config.world_size
    jobs = {m.store_job_id: workers for m in getattr(meta, "requests", ())
            if m.store_job_id is not None}
    if jobs:
        worker_meta = core.MooncakeStoreWorkerMetadata(completed_saves=jobs)
        kv_out = core.KVConnectorOutput(kv_connector_worker_meta=worker_meta)
    return core.ModelRunnerOutput(req_ids=ids, req_id_to_index={k: i for i, k in enumerate(ids)},
                                  sampled_token_ids=sampled, kv_connector_output=kv_out)


def connector_for(core, client, endpoint, rpc_port, args):
    """(connector class or factory, kv_transfer fields) of `client`, in the role of
    `--kv-role`: kv_consumer (the default) looks up and loads; kv_both also saves
    each prompt's blocks (vLLM's build then walks the running batch, and pins the
    blocks of every save until the worker reports it: `model_output`)."""
    extra = {"lookup_rpc_port": rpc_port, "load_async": False}
    role = {"kv_role": args.kv_role}
    if client == "vllm_sync":
        return core.MooncakeStoreConnector, {**role, "kv_connector_extra_config": {
            **extra, "lookup_async": False}}
    if client == "vllm_async":
        return core.MooncakeStoreConnector, {**role, "kv_connector_extra_config": {
            **extra, "lookup_async": True}}
    from mooncake_lookup.vllm import MooncakeLookupConnector
    factory = floor_connector() if client == "floor" else MooncakeLookupConnector
    return factory, {**role, "kv_connector": "MooncakeLookupConnector",
                                     "kv_connector_extra_config": {
        **extra, "lookup_async": True, "lookup_endpoint": endpoint,
        "lookup_prefetch_limit": args.prefetch_limit, "max_in_flight": args.max_in_flight}}


class FloorClient:
    """A lookup client that costs nothing: `lookup` answers `miss` at once (every
    lookup of this bench is a miss), its other calls do nothing."""

    def __init__(self, miss):
        self._miss = miss

    def lookup(self, req_id, num_tokens, block_hashes, non_block=False):
        return self._miss

    def prefetch(self, req_id, num_tokens, block_hashes):
        pass

    def flush(self):
        pass

    def on_allocated(self, req_id):
        pass

    def on_preempted(self, req_id):
        pass

    def discard(self, req_id):
        pass

    def reset(self):
        return True

    def close(self):
        pass


def floor_connector():
    """The `floor` client's connector class: mooncake_lookup.vllm's connector whose
    scheduler side and prefetch use a FloorClient, answering the miss that the
    drop-in's own client got for a first request (its result type, from the lookup
    server, before the drop-in's client is closed)."""
    from mooncake_lookup.vllm import MooncakeLookupConnector

    class FloorConnector(MooncakeLookupConnector):
        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config=kv_cache_config)
            prefetch = self.lookup_prefetch
            if prefetch is None:
                raise RuntimeError("the floor needs the drop-in's scheduler side")
            real = prefetch.client
            miss = real.lookup("step-bench-floor", BLOCK * BLOCKS, [bytes(32)] * BLOCKS)
            real.close()
            floor = FloorClient(miss)
            prefetch.client = floor
            prefetch._prefetch = floor.prefetch
            self.connector_scheduler.client = floor

    return FloorConnector


class Requests:
    """vLLM Requests made ahead of the timed steps (vLLM hashes each block at
    construction: 64 SHA-256 per request; in vLLM the engine's input thread makes
    them). Ids have the shape of vLLM 0.33's own for an OpenAI-API request:
    `chatcmpl-` and 16 hex digits (the API's id), `-` and 8 hex digits (the engine's
    suffix, InputProcessor), 34 characters each, seeded by `tag`."""

    def __init__(self, core, tag, count, max_tokens):
        rng = random.Random(tag)
        self.reqs = [vllm_core.make_request(
            core, f"chatcmpl-{rng.getrandbits(64):016x}-{rng.getrandbits(32):08x}",
            [(i * BLOCKS * BLOCK + t) % 30000 + 1 for t in range(BLOCKS * BLOCK)],
            max_tokens, BLOCK) for i in range(count)]
        self.next = 0

    def take(self, n):
        got = self.reqs[self.next:self.next + n]
        if len(got) < n:
            raise RuntimeError(f"the run needs more than the {len(self.reqs)} requests made")
        self.next += n
        return got


def run_one(core, client, workload, queue, endpoint, rpc_port, args, tag):
    """One run: per-step connector time, step time, waiting requests."""
    factory, kv = connector_for(core, client, endpoint, rpc_port, args)
    sched = vllm_core.build_scheduler(core, settings(args, queue), connector=factory,
                                      kv_transfer=kv)
    hooks = HookClock(sched.connector, args.breakdown)
    engine = EngineLoop(core.wheel, sched, lambda out: model_output(core, sched, out))
    # A step admits at most max_num_batched_tokens / 1,024 prompts (8): 12 a step is
    # room to spare.
    need = queue + (args.warmup_steps + args.steps) * 12 if workload == "steady" else queue
    reqs = Requests(core, tag, need, args.max_tokens)
    clock = time.perf_counter_ns
    out = {"client": client, "workload": workload, "queue": queue,
           "conn_ns": [], "step_ns": [], "waiting": [], "hook_calls": 0}
    if args.breakdown:
        out.update(hook_ns=[], client_ns=[], call_ns=[], conn_cpu_ns=[])

    def step(arrivals):
        made = reqs.take(arrivals)
        hooks.take()
        hooks.take_breakdown()
        calls0 = hooks.calls
        t0 = clock()
        for r in made:
            sched.add_request(r)
        waiting = len(sched.waiting)
        engine.turn()
        step_ns = clock() - t0
        conn_ns = hooks.take()
        parts = hooks.take_breakdown()
        time.sleep(args.forward_ms / 1e3)
        return conn_ns, step_ns, waiting, hooks.calls - calls0, parts

    def keep(got):
        conn_ns, step_ns, waiting, calls, (by_hook, client_ns, by_call, cpu_ns) = got
        if args.breakdown:
            out["conn_cpu_ns"].append(cpu_ns)
            out["hook_ns"].append(by_hook)
            out["client_ns"].append(client_ns)
            out["call_ns"].append(by_call)
        out["conn_ns"].append(conn_ns)
        out["step_ns"].append(step_ns)
        out["waiting"].append(waiting)
        out["hook_calls"] += calls

    # As vLLM's EngineCore does after its startup (freeze_gc_heap): what exists now
    # (the scheduler, the requests made ahead, the previous runs' garbage collected)
    # is frozen out of the collector, so a collection inside a timed step scans what
    # this run allocated, not the whole process.
    gc.collect()
    gc.freeze()
    try:
        if workload == "steady":
            for i in range(args.warmup_steps + args.steps):
                got = step(max(0, queue - len(sched.waiting)))
                if i >= args.warmup_steps:
                    keep(got)
        else:
            keep(step(queue))
            while sched.waiting and len(out["conn_ns"]) < args.burst_steps:
                keep(step(0))
    finally:
        gc.unfreeze()
        conn = sched.connector
        prefetch = getattr(conn, "lookup_prefetch", None)
        if prefetch is not None:
            prefetch.close()
        else:
            # vLLM's close() shuts its executor down without waiting and closes the
            # socket under a lookup still running there, which aborts libzmq
            # (signaler.cpp assertion): let the running one end first.
            client = conn.connector_scheduler.client
            executor = getattr(client, "executor", None)
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
            client.close()
    return out


def spread(values):
    """{median, min, max, per_rep} of per-repetition values."""
    return {"median": pct(values, 0.5), "min": min(values), "max": max(values),
            "per_rep": values}


def summary(runs):
    """Per run (delay, workload, queue, client, rep): p50/p99/max of the connector's
    time per step (µs), the step's p50 (µs), the connector's share of the step (p50 of
    the per-step shares), its total over the run's steps (µs; for a burst, what
    draining it cost the scheduler's thread). Per (delay, workload, queue): the
    drop-in's (and the floor's) ratios to vLLM's clients, paired within each
    repetition (p50 against p50; total against total; the largest per-step ratio to
    vLLM's async client over the steps both ran, and the steps where the drop-in is
    above a third of it: the burst's criterion, given for every cell; steps are paired
    by their index, whatever each client's step admitted), as median, min and max over
    the repetitions."""
    rows, by = [], {}
    for r in runs:
        c, s = r["conn_ns"], r["step_ns"]
        shares = [a / b for a, b in zip(c, s) if b]
        row = {k: r[k] for k in ("client", "delay_us", "workload", "queue", "rep")}
        row.update(conn_p50_us=pct(c, 0.5) / 1e3, conn_p99_us=pct(c, 0.99) / 1e3,
                   conn_max_us=max(c, default=0) / 1e3, step_p50_us=pct(s, 0.5) / 1e3,
                   share_p50=pct(shares, 0.5), steps=len(c), conn_total_us=sum(c) / 1e3)
        if "hook_ns" in r:
            row["breakdown"] = breakdown(r)
        rows.append(row)
        by[(r["delay_us"], r["workload"], r["queue"], r["client"], r["rep"])] = r
    cells = {}
    for (delay, workload, queue, client, rep), r in by.items():
        if client not in OURS:
            continue
        # The floor's keys are prefixed: "floor_steps_over_...".
        prefix = "" if client == "drop_in" else client + "_"
        ours = pct(r["conn_ns"], 0.5)
        got = cells.setdefault((delay, workload, queue), {})
        for other in ("vllm_sync", "vllm_async"):
            o = by.get((delay, workload, queue, other, rep))
            if o:
                got.setdefault(f"{other}_over_{client}_p50", []).append(
                    pct(o["conn_ns"], 0.5) / max(ours, 1))
                got.setdefault(f"{other}_over_{client}_total", []).append(
                    sum(o["conn_ns"]) / max(sum(r["conn_ns"]), 1))
        a = by.get((delay, workload, queue, "vllm_async", rep))
        if a:
            n = min(len(a["conn_ns"]), len(r["conn_ns"]))
            per_step = [r["conn_ns"][k] / max(a["conn_ns"][k], 1) for k in range(n)]
            got.setdefault(f"{client}_over_vllm_async_max_step", []).append(
                max(per_step, default=0))
            got.setdefault(f"{prefix}steps_over_a_third_of_vllm_async", []).append(
                sum(1 for x in per_step if x > 1 / 3))
            got.setdefault(f"{prefix}steps_both_ran", []).append(n)
    ratios = []
    for (delay, workload, queue), got in cells.items():
        reps = max(sum(1 for key in by if key[:4] == (delay, workload, queue, client))
                   for client in OURS)
        ratio = {"delay_us": delay, "workload": workload, "queue": queue, "reps": reps}
        ratio.update({k: spread(v) for k, v in got.items()})
        ratios.append(ratio)
    return rows, ratios


def breakdown(run):
    """Per step, mean and p50 (µs) of the scheduler thread's CPU time inside the hooks
    (`time.thread_time_ns`: without the time the thread waited for a core), of each
    hook's time, of the time inside the lookup client's own methods, and of the rest (the hooks' time outside the client: vLLM's
    shared connector code and the drop-in's Python wrappers), plus each client
    method's mean."""
    n = max(len(run["conn_ns"]), 1)
    # vLLM's connector bookkeeping, which every client runs (the drop-in's connector
    # is vLLM's): its hooks that are not lookups, without the client calls inside
    # them. A step where it alone exceeds a fifth (a third) of this client's step is
    # one where no other client could be 5x (3x) cheaper than this one.
    book = [sum(d.get(h, 0) for h in BOOKKEEPING)
            - sum(c.get(h, 0) for h in ("discard", "flush", "on_allocated", "on_preempted"))
            for d, c in zip(run["hook_ns"], run["call_ns"])]
    over = {f"over_{name}": sum(1 for b, t in zip(book, run["conn_ns"]) if b > t * frac)
            for name, frac in (("fifth", 1 / 5), ("third", 1 / 3))}
    names = sorted({h for d in run["hook_ns"] for h in d})
    calls = sorted({h for d in run["call_ns"] for h in d if not h.startswith("n_")})
    rest = [c - k for c, k in zip(run["conn_ns"], run["client_ns"])]
    return {
        "hooks": {h: {"mean_us": sum(d.get(h, 0) for d in run["hook_ns"]) / n / 1e3,
                      "p50_us": pct([d.get(h, 0) for d in run["hook_ns"]], 0.5) / 1e3}
                  for h in names},
        "cpu": {"mean_us": sum(run["conn_cpu_ns"]) / n / 1e3,
                "p50_us": pct(run["conn_cpu_ns"], 0.5) / 1e3},
        "client": {"mean_us": sum(run["client_ns"]) / n / 1e3,
                   "p50_us": pct(run["client_ns"], 0.5) / 1e3},
        "outside_client": {"mean_us": sum(rest) / n / 1e3, "p50_us": pct(rest, 0.5) / 1e3},
        "calls": {h: sum(d.get(h, 0) for d in run["call_ns"]) / n / 1e3 for h in calls},
        "calls_per_step": {h: sum(d.get("n_" + h, 0) for d in run["call_ns"]) / n
                           for h in calls},
        "bookkeeping": {"mean_us": sum(book) / n / 1e3, "p50_us": pct(book, 0.5) / 1e3,
                        "steps": len(book), **over},
    }


def breakdown_table(rows):
    lines = []
    for r in rows:
        b = r.get("breakdown")
        if not b:
            continue
        hooks = ", ".join(f"{h} {v['mean_us']:.0f}" for h, v in b["hooks"].items()
                          if v["mean_us"] >= 0.5)
        calls = ", ".join(f"{h} {v:.0f} ({b['calls_per_step'][h]:.1f} calls)"
                          for h, v in b["calls"].items())
        lines.append(
            f"{r['delay_us']:>6} {r['workload']:<6} {r['queue']:>5} {r['client']:<10} "
            f"thread CPU in hooks p50 {b['cpu']['p50_us']:.0f} mean {b['cpu']['mean_us']:.0f}; "
            f"client p50 {b['client']['p50_us']:.0f} mean {b['client']['mean_us']:.0f}; "
            f"outside it p50 {b['outside_client']['p50_us']:.0f} mean "
            f"{b['outside_client']['mean_us']:.0f}\n        hooks (mean µs): {hooks}"
            f"\n        client calls (mean µs): {calls}"
            f"\n        vLLM's bookkeeping (build_connector_meta, update_state_after_alloc,"
            f" request_finished, without client calls) p50 {b['bookkeeping']['p50_us']:.0f}"
            f" µs; above a fifth of the step at {b['bookkeeping']['over_fifth']}, a third at"
            f" {b['bookkeeping']['over_third']} of {b['bookkeeping']['steps']} steps")
    return "\n".join(lines)


def table(rows, ratios):
    """Per (delay, workload, queue, client): the median over the repetitions of each
    run's figures; then the paired ratios, median [min-max]."""
    lines = [f"{'delay':>6} {'load':<6} {'queue':>5} {'client':<10} {'conn p50':>9} "
             f"{'p99':>9} {'max':>9} {'step p50':>9} {'share':>6}  (µs; median of reps)"]
    cells = {}
    for r in rows:
        cells.setdefault((r["delay_us"], r["workload"], r["queue"], r["client"]), []).append(r)
    for (delay, workload, queue, client), rs in cells.items():
        def med(key):
            return pct([r[key] for r in rs], 0.5)
        lines.append(f"{delay:>6} {workload:<6} {queue:>5} {client:<10} "
                     f"{med('conn_p50_us'):>9.1f} {med('conn_p99_us'):>9.1f} "
                     f"{med('conn_max_us'):>9.1f} {med('step_p50_us'):>9.1f} "
                     f"{med('share_p50') * 100:>5.1f}%")

    def show(g, key, digits):
        v = g.get(key)
        if not v:
            return "-"
        return f"{v['median']:.{digits}f} [{v['min']:.{digits}f}-{v['max']:.{digits}f}]"

    for g in ratios:
        lines.append(
            f"delay {g['delay_us']} {g['workload']} {g['queue']} ({g['reps']} reps, paired): "
            f"vLLM sync / drop-in {show(g, 'vllm_sync_over_drop_in_p50', 1)}x, "
            f"vLLM async / drop-in {show(g, 'vllm_async_over_drop_in_p50', 1)}x, "
            f"worst step drop-in / vLLM async {show(g, 'drop_in_over_vllm_async_max_step', 2)}, "
            f"steps above a third of vLLM async "
            f"{show(g, 'steps_over_a_third_of_vllm_async', 0)} of "
            f"{show(g, 'steps_both_ran', 0)}; total over the run: vLLM async / drop-in "
            f"{show(g, 'vllm_async_over_drop_in_total', 1)}x")
        if g.get("vllm_async_over_floor_p50"):
            lines.append(
                f"  floor (a lookup client costing nothing): vLLM async / floor "
                f"{show(g, 'vllm_async_over_floor_p50', 1)}x, steps above a third of "
                f"vLLM async {show(g, 'floor_steps_over_a_third_of_vllm_async', 0)} of "
                f"{show(g, 'floor_steps_both_ran', 0)}; total over the run: vLLM async / "
                f"floor {show(g, 'vllm_async_over_floor_total', 1)}x")
    return "\n".join(lines)


def start_server(binary, base, delay_us):
    proc = subprocess.Popen(
        [binary, "--base-path", base, "--hostname", socket.gethostname(), "--block-size",
         str(BLOCK), "--index-delay-us", str(delay_us), "--max-concurrency", "1024"],
        stdout=subprocess.PIPE, text=True)
    endpoint = proc.stdout.readline().strip()
    if not endpoint:
        proc.kill()
        raise RuntimeError(f"{binary} printed no endpoint (exit {proc.wait()})")
    return proc, endpoint


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--lookup-server", required=True)
    ap.add_argument("--queues", default="32,256,1024")
    ap.add_argument("--delays-us", default="100,500")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--workloads", default="steady,burst")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--burst-steps", type=int, default=400)
    ap.add_argument("--forward-ms", type=float, default=5.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--gpu-blocks", type=int, default=16384)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--kv-role", choices=("kv_consumer", "kv_both"), default="kv_consumer",
                    help="the connectors' role (kv_both: saves too)")
    ap.add_argument("--prefetch-limit", type=int, default=64)
    ap.add_argument("--max-in-flight", type=int, default=16)
    ap.add_argument("--reps", type=int, default=1,
                    help="repetitions of each (delay, workload, queue): the clients run "
                         "in turn within each, and the ratios are paired per repetition")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time each hook and the lookup client's own calls "
                         "(a Python frame per client call: for profiling, not the headline)")
    args = ap.parse_args()
    for c in args.clients.split(","):
        if c not in CLIENTS + EXTRA_CLIENTS:
            ap.error(f"--clients: {c!r} is not one of {', '.join(CLIENTS + EXTRA_CLIENTS)}")
    base = tempfile.mkdtemp(prefix="step-bench-")
    os.environ["VLLM_RPC_BASE_PATH"] = base
    core = mooncake_store.load(args.wheel)
    core.get_zmq_rpc_path_lookup.__globals__["envs"].VLLM_RPC_BASE_PATH = base
    runs = []
    for delay in [int(d) for d in args.delays_us.split(",")]:
        server, endpoint = start_server(args.lookup_server, base, delay)
        try:
            for workload in args.workloads.split(","):
                for queue in [int(q) for q in args.queues.split(",")]:
                    for rep in range(args.reps):
                        for client in args.clients.split(","):
                            t = time.time()
                            r = run_one(core, client, workload, queue, endpoint, 0, args,
                                        f"{client}-{delay}-{workload}-{queue}-{rep}")
                            r["delay_us"] = delay
                            r["rep"] = rep
                            runs.append(r)
                            print(f"  {delay} us {workload} {queue} {client} rep {rep}: "
                                  f"{len(r['conn_ns'])} steps, {time.time() - t:.1f} s",
                                  file=sys.stderr, flush=True)
        finally:
            server.kill()
            server.wait()
    rows, ratios = summary(runs)
    print(table(rows, ratios), file=sys.stderr)
    if args.breakdown:
        print(breakdown_table(rows), file=sys.stderr)
    cfg = {k: v for k, v in vars(args).items() if k not in ("wheel", "lookup_server")}
    cfg.update(python=sys.version.split()[0], vllm="0.33.0", blocks=BLOCKS, block_size=BLOCK)
    print(json.dumps({"settings": cfg, "runs": runs, "summary": rows, "ratios": ratios}))


if __name__ == "__main__":
    main()
