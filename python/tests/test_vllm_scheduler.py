"""vLLM 0.33.0's own `MooncakeStoreScheduler` and `MooncakeStoreConnector` (from its
wheel, vllm_scheduler.py) with the drop-in in place of vLLM's client
(`mooncake_lookup.vllm.MooncakeLookupConnector`), against the same vLLM
`LookupKeyServer` as vLLM's own client, through a request's whole life: arrival,
pending, ready, allocation, preemption, finish, reset."""

import importlib
import inspect
import multiprocessing
import threading
import time
from types import SimpleNamespace

import pytest

import mooncake_lookup
from conftest import StoreWorker, vllm_config
from vllm_scheduler import install_vllm_modules, load_scheduler_classes

BS = 16


def h(i):
    return bytes([i]) * 32


PRESENT = [h(1), h(2), h(3)]


@pytest.fixture(scope="module")
def vllm(vllm_classes):
    from conftest import wheel_path

    return load_scheduler_classes(wheel_path(), vllm_classes)


@pytest.fixture
def connector_module(vllm, monkeypatch):
    """`mooncake_lookup.vllm`, imported as vLLM's factory imports a
    `kv_connector_module_path`, over vLLM's own connector classes."""
    install_vllm_modules(monkeypatch, vllm)
    return importlib.import_module("mooncake_lookup.vllm")


class GatedWorker(StoreWorker):
    """The store worker behind vLLM's `LookupKeyServer`, answering a lookup only once
    `gate` is set: a lookup is pending for as long as the test wants."""

    def __init__(self, classes, present):
        super().__init__(classes, BS, present)
        self.gate = threading.Event()
        self.gate.set()

    def lookup(self, num_tokens, block_hashes):
        assert self.gate.wait(10.0), "gate never opened"
        return super().lookup(num_tokens, block_hashes)


@pytest.fixture
def server(vllm_classes, rpc_base):
    worker = GatedWorker(vllm_classes, PRESENT)
    srv = vllm_classes.LookupKeyServer(worker, vllm_config(BS))
    yield worker
    worker.gate.set()
    srv.running = False


def engine_config(kv_role="kv_both", **extra):
    """The parts of `VllmConfig` vLLM's connector and scheduler read."""
    extra.setdefault("lookup_async", True)
    cfg = vllm_config(BS, **extra)
    cfg.kv_transfer_config.kv_role = kv_role
    cfg.kv_events_config = None
    cfg.parallel_config.world_size = 1
    cfg.parallel_config.prefill_context_parallel_size = 1
    return cfg


def kv_cache_config():
    group = SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=BS, prefix_cacheable=True))
    return SimpleNamespace(
        prefix_cacheable_group_ids=[0], prefix_cacheable_groups=[group], kv_cache_groups=[group])


class Pool:
    """Stand-in for the GPU block pool: counts references."""

    def __init__(self):
        self.blocks = list(range(64))
        self.refs = {}

    def touch(self, blocks):
        for b in blocks:
            self.refs[b] = self.refs.get(b, 0) + 1


def request(req_id, blocks):
    """A waiting request of `blocks` hashes (1, 2, ...) and one more token."""
    hashes = [h(i + 1) for i in range(blocks)]
    n = blocks * BS + 1
    return SimpleNamespace(
        request_id=req_id, num_tokens=n, block_hashes=hashes, num_prompt_tokens=n,
        prompt_token_ids=list(range(n)), all_token_ids=list(range(n)),
        num_computed_tokens=0, skip_reading_prefix_cache=False)


def changed(req, **fields):
    """`req` with `fields` replaced."""
    return SimpleNamespace(**{**vars(req), **fields})


def step(new=(), finished=(), preempted=()):
    """A `SchedulerOutput`: `new` as (request, block ids, tokens scheduled, tokens
    computed locally)."""
    return SimpleNamespace(
        finished_req_ids=set(finished), preempted_req_ids=set(preempted),
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r.request_id, num_computed_tokens=c, block_ids=(list(b),),
                            prefill_token_ids=None, prompt_token_ids=r.prompt_token_ids)
            for r, b, _, c in new],
        num_scheduled_tokens={r.request_id: n for r, _, n, _ in new},
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]),
        kv_connector_block_state=SimpleNamespace(
            boundary_state_offloads=None,
            get_block_ids=lambda rid: {r.request_id: (list(b),) for r, b, _, _ in new}.get(rid)),
    )


class Blocks:
    """Stand-in for `KVCacheBlocks`: one group's block ids."""

    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self, group_ids=None):
        return (list(self.ids),)


def poll(connector, req, computed=0, polls=5000):
    """`get_num_new_matched_tokens` until it is not pending; (answer, pending polls)."""
    for n in range(polls):
        got = connector.get_num_new_matched_tokens(req, computed)
        if got[0] is not None:
            return got, n
        time.sleep(0.001)
    pytest.fail(f"{req.request_id}: still pending after {polls} polls")


def load_spec_of(meta):
    """(request id, load spec as plain values) of each request of a connector meta."""
    out = []
    for m in meta.requests:
        s = m.load_spec
        out.append((m.req_id, None if s is None else (
            s.vllm_cached_tokens, s.kvpool_cached_tokens, s.can_load,
            tuple((b.group_id, b.num_tokens) for b in s.tail_key_boundaries))))
    return out


def lifecycle(connector, worker):
    """Arrival, pending, ready, allocation, preemption, re-probe, finish, reset; what
    vLLM's scheduler answered at each point."""
    pool = Pool()
    connector.bind_gpu_block_pool(pool)
    out = {}
    r = request("r1", 4)
    worker.gate.clear()
    connector.on_new_request(r)
    out["pending"] = connector.get_num_new_matched_tokens(r, 0)
    worker.gate.set()
    out["ready"], _ = poll(connector, r)
    connector.update_state_after_alloc(r, Blocks([1, 2, 3, 4, 5]), out["ready"][0])
    out["alloc_meta"] = load_spec_of(connector.build_connector_meta(step(new=[(r, [1, 2, 3, 4, 5], 17, 0)])))
    # Preempted: probed again from 0 computed tokens, with the local hit of one block.
    out["preempt_meta"] = load_spec_of(connector.build_connector_meta(step(preempted=["r1"])))
    out["reprobe"], _ = poll(connector, r, computed=BS)
    connector.update_state_after_alloc(r, Blocks([6, 7, 8, 9, 10]), out["reprobe"][0])
    out["reprobe_meta"] = load_spec_of(connector.build_connector_meta(step(new=[(r, [6, 7, 8, 9, 10], 33, BS)])))
    out["finished"] = connector.request_finished(r, [6, 7, 8, 9, 10])
    out["finish_meta"] = load_spec_of(connector.build_connector_meta(step(finished=["r1"])))
    # A miss, a prompt under one block.
    out["miss"], _ = poll(connector, changed(request("r2", 2), block_hashes=[h(7), h(8)]))
    out["short"] = connector.get_num_new_matched_tokens(
        changed(request("r3", 1), num_tokens=BS - 1), 0)
    out["reset"] = connector.reset_cache()
    out["after_reset"], _ = poll(connector, request("r4", 4))
    out["pins"] = dict(pool.refs)
    return out


WANT = {
    "pending": (None, False),
    "ready": (3 * BS, True),
    "alloc_meta": [("r1", (0, 3 * BS, True, ((0, 3 * BS),)))],
    "preempt_meta": [],
    "reprobe": (2 * BS, True),
    "reprobe_meta": [("r1", (BS, 3 * BS, True, ((0, 3 * BS),)))],
    "finished": (False, None),
    "finish_meta": [],
    "miss": (0, False),
    "short": (0, False),
    "reset": True,
    "after_reset": (0, False),
    "pins": {},
}


def test_the_connector_loads_as_vllms_factory_loads_it(connector_module, vllm):
    """`kv_connector_module_path` = mooncake_lookup.vllm: the class is found by name,
    it subclasses vLLM's connector and takes `kv_cache_config` (the factory's check)."""
    cls = getattr(connector_module, "MooncakeLookupConnector")
    assert issubclass(cls, vllm.MooncakeStoreConnector)
    assert "kv_cache_config" in inspect.signature(cls).parameters


def test_lifecycle_answers_equal_vllms_scheduler_with_its_own_client(
        vllm, connector_module, server):
    theirs = vllm.MooncakeStoreConnector(
        engine_config(), vllm.KVConnectorRole.SCHEDULER, kv_cache_config())
    want = lifecycle(theirs, server)
    theirs.connector_scheduler.client.close()
    assert want == WANT
    server.present = set(PRESENT)
    ours = connector_module.MooncakeLookupConnector(
        engine_config(lookup_prefetch_limit=4), vllm.KVConnectorRole.SCHEDULER, kv_cache_config())
    try:
        client = ours.connector_scheduler.client
        assert isinstance(client, mooncake_lookup.LookupKeyClient)
        # The arrival sent the lookup before any probe; the probe waited for it.
        lookups_before = server.lookups
        got = lifecycle(ours, server)
        assert got == want
        # r1 (arrival + re-probe after preemption), r2, r4: one lookup each, no more.
        assert server.lookups - lookups_before == 4
        assert client.tracked_requests() == 0
    finally:
        ours.shutdown()


def test_prefetch_is_dropped_on_finish_allocation_and_preemption(connector_module, vllm, server):
    ours = connector_module.MooncakeLookupConnector(
        engine_config(lookup_prefetch_limit=4), vllm.KVConnectorRole.SCHEDULER, kv_cache_config())
    client = ours.connector_scheduler.client
    try:
        server.gate.clear()
        for rid in ("a", "b", "c"):
            ours.on_new_request(request(rid, 3))
        # Ineligible: under one block, no hashes, or skipping the prefix cache.
        ours.on_new_request(changed(request("s", 1), num_tokens=BS - 1))
        ours.on_new_request(changed(request("n", 3), block_hashes=[]))
        ours.on_new_request(changed(request("k", 3), skip_reading_prefix_cache=True))
        assert client.tracked_requests() == 3
        ours.request_finished(request("a", 3), [])
        assert client.tracked_requests() == 2
        ours.update_state_after_alloc(request("b", 3), Blocks([]), 0)
        assert client.tracked_requests() == 1
        ours.build_connector_meta(step(preempted=["c"]))
        assert client.tracked_requests() == 0
        server.gate.set()
    finally:
        ours.shutdown()
    assert client.lookup("z", 4 * BS + 1, PRESENT).hit_length == 0
    assert client.answer_of("z") == mooncake_lookup.Answer("unavailable", 0, "closed")


def test_a_preemption_policy_the_drop_in_cannot_follow_is_an_error(connector_module, vllm, rpc_base):
    for policy, match in (("keep", "use 'discard'"), ("later", "not one of")):
        with pytest.raises(ValueError, match=match):
            connector_module.MooncakeLookupConnector(
                engine_config(lookup_on_preemption=policy), vllm.KVConnectorRole.SCHEDULER,
                kv_cache_config())


def _vllm_probe(vllm, done):
    """In a child: vLLM's scheduler with its own client probes once (blocking)."""
    sched = vllm.MooncakeStoreScheduler(engine_config(lookup_async=False), kv_cache_config())
    sched.get_num_new_matched_tokens(request("v", 4), 0)
    done.set()


def test_dead_server_is_unavailable_where_vllms_scheduler_blocks(connector_module, vllm, rpc_base):
    """No server at the ipc path: vLLM's own scheduler, with its client, is still
    blocked in its probe after a bounded wait; the drop-in answers 0 within
    lookup_timeout_s, as unavailable (not a miss), and so does vLLM's scheduler code
    over it."""
    ctx = multiprocessing.get_context("fork")
    done = ctx.Event()
    blocked = ctx.Process(target=_vllm_probe, args=(vllm, done), daemon=True)
    blocked.start()
    ours = connector_module.MooncakeLookupConnector(
        engine_config(lookup_timeout_s=0.3), vllm.KVConnectorRole.SCHEDULER, kv_cache_config())
    try:
        got, _ = poll(ours, request("o", 4), polls=2000)
        assert got == (0, False)
        client = ours.connector_scheduler.client
        # The connector's lookup at the first probe fails at once (no connection):
        # read by that probe (`transport`) or, when the failure came first, behind the
        # failure backoff (`retrying`, rule 11). Either way not a miss.
        answer = client.answer_of("o")
        assert (answer.kind, answer.hit_tokens) == ("unavailable", 0)
        assert answer.reason in ("transport", "retrying")
        assert not done.wait(1.0)
        assert blocked.is_alive()
    finally:
        blocked.kill()
        blocked.join()
        ours.shutdown()


def _plain(value):
    """`value` as plain comparable data: dataclasses and objects by their fields, sets
    sorted, sequences as tuples."""
    if isinstance(value, (str, int, float, bool, type(None), bytes)):
        return value
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(_plain(v) for v in value))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "__dict__"):
        return (type(value).__name__, _plain(vars(value)))
    return repr(value)


def many_running(connector, worker, steps=8, per_step=8):
    """`steps` scheduler steps over a growing running batch
    (`scheduled_cached_reqs`). Each step looks up `per_step` arrivals, then allocates
    them in the reverse order (so the scheduler's unfinished requests are not in
    lookup order): even ones hit 3 blocks in the store, odd ones miss; each prefills
    what it computes in chunks of at most 32 tokens, then decodes one token a step.
    Arrivals 0 and 2 (hits) wait for their loads (allocated, not scheduled: the
    build's pass over unscheduled requests issues them) and are scheduled the step
    after. One more arrival a step is looked up (a hit) and never allocated, one is
    allocated with 0 external tokens (its load refused, as MultiConnector may) and
    never scheduled. From step 4 one running request finishes a step; at step 5 a
    running request that hit is preempted, and it resumes at step 6, looked up again
    (a hit) and allocated with its external tokens. Returns, per step, the metadata
    and what the call left in the scheduler output, as plain data, and the pool's
    pins, and the scheduler's request trackers after each build."""
    pool = Pool()
    pool.blocks = list(range(steps * per_step * 8 + 64))
    connector.bind_gpu_block_pool(pool)
    tables, reqs, computed, hits, running, out = {}, {}, {}, set(), [], []
    next_block, loading, resumed = 1, [], None

    def allocate(r, ext):
        nonlocal next_block
        tables[r.request_id] = list(range(next_block, next_block + 5))
        next_block += 5
        connector.update_state_after_alloc(r, Blocks(tables[r.request_id]), ext)

    for k in range(steps):
        new, finished, preempted = [], [], []
        for r, ext in loading:
            new.append((r, tables[r.request_id], min(32, r.num_tokens - ext), ext))
        loading = []
        looked_up = []
        for i in range(per_step):
            r = request(f"s{k}-{i}", 4)
            if i % 2:
                # A miss: its whole prompt prefills here, in chunks.
                r = changed(r, block_hashes=[h(100 + k * per_step + i)] * 4)
            reqs[r.request_id] = r
            connector.on_new_request(r)
            (ext, _), _ = poll(connector, r)
            looked_up.append((i, r, ext))
            if ext:
                hits.add(r.request_id)
        for i, r, ext in reversed(looked_up):
            allocate(r, ext)
            if i in (0, 2):
                loading.append((r, ext))
            else:
                new.append((r, tables[r.request_id], min(32, r.num_tokens - ext), ext))
        # Looked up (a hit: vLLM keeps its load spec) but not allocated; and one
        # allocated with its load refused. Neither is scheduled.
        for name, ext in ((f"w{k}", None), (f"x{k}", 0)):
            r = request(name, 4)
            connector.on_new_request(r)
            poll(connector, r)
            if ext is not None:
                allocate(r, ext)
        if k >= 4 and running:
            gone = running.pop(0)
            connector.request_finished(reqs[gone], tables[gone])
            finished.append(gone)
        if k == 5:
            victim = next(rid for rid in running if rid in hits)
            running.remove(victim)
            preempted.append(victim)
        out_step = step(new=new, finished=finished, preempted=preempted)
        cached = out_step.scheduled_cached_reqs
        scheduled = {}
        for n, rid in enumerate(running):
            cached.req_ids.append(rid)
            cached.new_block_ids.append(None if n % 3 else ([next_block],))
            cached.num_computed_tokens.append(computed[rid])
            left = reqs[rid].num_tokens - computed[rid]
            scheduled[rid] = min(32, left) if left > 0 else 1
        if resumed is not None:
            r = reqs[resumed]
            (ext, _), _ = poll(connector, r)
            allocate(r, ext)
            cached.req_ids.append(resumed)
            cached.new_block_ids.append((list(tables[resumed]),))
            cached.num_computed_tokens.append(0)
            cached.resumed_req_ids.add(resumed)
            computed[resumed] = 0
            scheduled[resumed] = 32
            running.append(resumed)
            resumed = None
        out_step.num_scheduled_tokens.update(scheduled)
        out_step.kv_connector_block_state.get_block_ids = (
            lambda rid: (list(tables[rid]),) if rid in tables else None)
        lists_before = (cached.req_ids, cached.new_block_ids, cached.num_computed_tokens)
        meta = connector.build_connector_meta(out_step)
        lists_after = (cached.req_ids, cached.new_block_ids, cached.num_computed_tokens)
        now_scheduled = {r.request_id for r, *_ in new}
        out.append({
            "meta": _plain(meta),
            "lists_kept": all(a is b for a, b in zip(lists_after, lists_before)),
            "output": _plain(cached), "running": len(cached.req_ids),
            "trackers": _plain(connector.connector_scheduler._request_trackers),
            "pending_loads": [m.req_id for m in meta.requests
                              if m.load_spec is not None and m.req_id not in now_scheduled],
            "saves": sum(1 for m in meta.requests if m.can_save),
        })
        for rid, n in scheduled.items():
            computed[rid] += n
        for r, _, n, ext in new:
            computed[r.request_id] = ext + n
            if r.request_id not in running:
                running.append(r.request_id)
        if preempted:
            resumed = preempted[0]
    return out, dict(pool.refs)


class BuildSpy:
    """Wraps a connector's `MooncakeStoreScheduler.build_connector_meta` and records,
    from inside vLLM's build, the type of the step's running ids, their number, and
    how many unfinished requests its last pass would walk, of how many."""

    def __init__(self, connector):
        sched = connector.connector_scheduler
        self.seen, inner = [], sched.build_connector_meta

        def spy(scheduler_output):
            ids = scheduler_output.scheduled_cached_reqs.req_ids
            unfinished = sched._unfinished_requests
            self.seen.append((type(ids).__name__, len(ids),
                              (len(list(unfinished.items())), len(unfinished))))
            return inner(scheduler_output)

        sched.build_connector_meta = spy


@pytest.mark.parametrize("kv_role,save_decode_cache", [
    ("kv_both", False), ("kv_consumer", False), ("kv_both", True)])
def test_build_connector_meta_equals_vllms_over_a_running_batch(
        vllm, connector_module, server, kv_role, save_decode_cache):
    """The connector's `build_connector_meta` (which gives vLLM's the step's running
    ids as a dict, not a list, for its membership tests, and narrows its pass over
    unfinished requests to those with a load spec) builds the same metadata and
    leaves the same request trackers as vLLM's own connector, step by step, over a
    batch of up to 50 running requests (`many_running`), for a producer (the default:
    decodes not saved; then saved) and a consumer (whose build skips the running
    requests' pass), and leaves the scheduler output as it found it."""
    extra = {"save_decode_cache": True} if save_decode_cache else {}
    theirs = vllm.MooncakeStoreConnector(
        engine_config(kv_role, **extra), vllm.KVConnectorRole.SCHEDULER, kv_cache_config())
    try:
        want, want_pins = many_running(theirs, server)
    finally:
        theirs.connector_scheduler.client.close()
    # Each step's two waiting loads went out through the pass over unscheduled
    # requests, in the order they were allocated (not looked up); at step 6 a producer
    # also loads the resumed request (s0-4) in its pass over the running requests,
    # which a consumer's build skips.
    loads = [[f"s{k}-2", f"s{k}-0"] for k in range(8)]
    if kv_role == "kv_both":
        loads[6].insert(0, "s0-4")
    assert [w["pending_loads"] for w in want] == loads
    assert [w["running"] for w in want] == [0, 6, 14, 22, 29, 35, 43, 50]
    # vLLM's saves a step: a consumer's none; a producer saving decodes has two more a
    # step from step 1 (the two hits that loaded in their admission step, where a
    # request cannot save and load at once, save their 64 tokens at their first
    # decode, which a producer not saving decodes skips).
    saves = {("kv_both", False): [4, 10, 10, 10, 10, 10, 10, 11],
             ("kv_consumer", False): [0] * 8,
             ("kv_both", True): [4, 12, 12, 12, 12, 12, 12, 13]}[kv_role, save_decode_cache]
    assert [w["saves"] for w in want] == saves
    ours = connector_module.MooncakeLookupConnector(
        engine_config(kv_role, lookup_prefetch_limit=16, **extra),
        vllm.KVConnectorRole.SCHEDULER, kv_cache_config())
    spy = BuildSpy(ours)
    try:
        got, got_pins = many_running(ours, server)
    finally:
        ours.shutdown()
    assert [g["lists_kept"] for g in got] == [True] * 8
    assert got == want
    assert got_pins == want_pins
    # Inside vLLM's build: the running ids as a dict from 16 running requests, and a
    # last pass over the unfinished requests with a load spec only (when the build
    # starts: the step's two waiting loads, its two scheduled hits, whose specs the
    # build pops before that pass, its refused load, and at step 6 the resumed
    # request), not all of them.
    assert [(t, n) for t, n, _ in spy.seen] == [
        ("list", 0), ("list", 6), ("list", 14), ("dict", 22), ("dict", 29), ("dict", 35),
        ("dict", 43), ("dict", 50)]
    # (A consumer's build keeps the resumed request's load spec: it skips the running
    # requests' pass, and the last pass skips a running request.)
    last = 6 if kv_role == "kv_consumer" else 5
    assert [walked for *_, walked in spy.seen] == [
        (5, 9), (5, 18), (5, 27), (5, 36), (5, 45), (5, 53), (6, 61), (last, 69)]
