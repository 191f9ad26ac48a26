"""vLLM 0.33.0's own MooncakeStoreConnector (scheduler side) runs inside vLLM's own
Scheduler, loaded by mooncake_store.load, and asks vLLM's own LookupKeyServer over
real ZeroMQ."""

import contextlib
import os

import harness
import mooncake_store
import pytest
import vllm_core
import zmq

SETTINGS = {"block_size": 16, "num_gpu_blocks": 64, "max_num_seqs": 4,
            "max_num_batched_tokens": 64, "max_model_len": 4096, "enable_chunked_prefill": True,
            "enable_prefix_caching": True, "long_prefill_token_threshold": 0,
            "async_scheduling": False, "scheduler_reserve_full_isl": True}


@pytest.fixture(scope="module")
def store_core(wheel):
    return mooncake_store.load(wheel)


class StoreWorker:
    """What vLLM's LookupKeyServer reads of MooncakeStoreWorker: `lookup` answers
    `hit` tokens; no send thread."""

    kv_send_thread = None

    def __init__(self, result_type, hit):
        self.result_type, self.hit, self.asked = result_type, hit, []

    def lookup(self, num_tokens, block_hashes):
        self.asked.append((num_tokens, len(block_hashes)))
        return self.result_type(self.hit)


class PresentBlocks:
    """What vLLM's LookupKeyServer reads of MooncakeStoreWorker, over a set of present
    block hashes: the leading run of present blocks among the request's full blocks,
    a hit covering every token re-derived below the request's end (as
    MooncakeStoreWorker.lookup does)."""

    kv_send_thread = None

    def __init__(self, result_type, present, block_size=16):
        self.result_type, self.present, self.bs = result_type, set(present), block_size

    def lookup(self, num_tokens, block_hashes):
        blocks = min(len(block_hashes), num_tokens // self.bs)
        run = 0
        while run < blocks and bytes(block_hashes[run]) in self.present:
            run += 1
        if run * self.bs >= num_tokens:
            run = min(run, (num_tokens - 1) // self.bs)
        return self.result_type(run * self.bs)


@contextlib.contextmanager
def lookup_server(core, worker, kv):
    """vLLM's own LookupKeyServer over `worker`, stopped by a last request (closing
    its socket under its thread aborts libzmq)."""
    cfg = vllm_core.vllm_config(core, SETTINGS, True, kv)
    server = core.LookupKeyServer(worker, cfg)
    try:
        yield server
    finally:
        server.running = False
        if server.thread.is_alive():
            stop = zmq.Context.instance().socket(zmq.REQ)
            stop.setsockopt(zmq.LINGER, 0)
            stop.setsockopt(zmq.RCVTIMEO, 5000)
            stop.connect(core.get_zmq_rpc_path_lookup(cfg))
            stop.send_multipart([b"stop"])  # an unknown tag: vLLM's server answers RESP_ERR
            with contextlib.suppress(zmq.Again):
                stop.recv()
            stop.close()
            server.thread.join(5)
        assert not server.thread.is_alive()
        server.close()


def test_the_scenario_connector_answers_as_vllms_store_connector(store_core, tmp_path,
                                                                 monkeypatch):
    """The same scenario through the harness's ScenarioConnector and through vLLM's
    MooncakeStoreConnector asking a store that holds each request's `hit_tokens`
    leading blocks: the same step log (the stand-in's clamps are vLLM's)."""
    core = store_core
    monkeypatch.setattr(core.get_zmq_rpc_path_lookup.__globals__["envs"],
                        "VLLM_RPC_BASE_PATH", str(tmp_path))

    def req(rid, step, prompt, n_out, hit):
        return {"request_id": rid, "arrival_step": step, "prompt_token_ids": list(prompt),
                "output_token_ids": [7] * n_out,
                "connector": {"kind": "ready", "hit_tokens": hit}}
    settings = {**SETTINGS, "num_gpu_blocks": 9, "max_num_batched_tokens": 64,
                "max_steps": 300}
    requests = [req("r0", 0, range(1000, 1050), 30, 32),   # 2 of 3 full blocks stored
                req("r1", 0, range(2000, 2048), 30, 48),   # all 3: cut below the end
                req("r2", 1, range(3000, 3010), 2, 0),     # shorter than a block
                req("r3", 2, range(4000, 4070), 20, 64),
                req("r4", 3, range(5000, 5040), 5, 16)]
    scenario = {"settings": settings, "requests": requests}
    stand_in = list(harness.run(core, scenario))
    present = set()
    for r in requests:
        hashes = vllm_core.make_request(core, r["request_id"], r["prompt_token_ids"], 1,
                                        16).block_hashes
        present |= {bytes(h) for h in hashes[:r["connector"]["hit_tokens"] // 16]}
    # kv_consumer: loads only. As kv_both the connector also saves, holds a finished
    # request's blocks (request_finished -> True) until the worker reports the save
    # in KVConnectorOutput.finished_sending, which this model runner never does.
    kv = {"kv_role": "kv_consumer",
          "kv_connector_extra_config": {"lookup_rpc_port": os.getpid() + 1,
                                        "load_async": False}}
    scheds = []
    with lookup_server(core, PresentBlocks(core.MooncakeLookupResult, present), kv):
        try:
            real = list(harness.run(core, scenario, on_step=lambda s, _: scheds.append(s),
                                    connector=core.MooncakeStoreConnector, kv_transfer=kv))
        finally:
            # The scheduler role's shutdown leaves its lookup socket open (a vLLM
            # process exits after it); an open socket blocks this process's exit.
            if scheds:
                scheds[0].connector.connector_scheduler.client.close()
    assert real == stand_in
    # r1 is preempted once and re-admitted on its own cached blocks (no external
    # tokens: the local hit covers the stored ones).
    assert [p for x in real[:-1] for p in x["preempted"]] == ["r1"]
    assert [h for x in real[:-1] for h in x["external_hits"]] == [
        ["r0", 32], ["r1", 32], ["r2", 0], ["r1", 0], ["r3", 64], ["r4", 16]]
    assert real[-1] == {"end": True, "steps": 63, "finished": 5}


def test_vllms_store_connector_loads_the_stores_hit_synchronously(store_core, tmp_path,
                                                                   monkeypatch):
    core = store_core
    monkeypatch.setattr(core.get_zmq_rpc_path_lookup.__globals__["envs"],
                        "VLLM_RPC_BASE_PATH", str(tmp_path))
    kv = {"kv_connector_extra_config": {"lookup_rpc_port": os.getpid(), "load_async": False}}
    worker = StoreWorker(core.MooncakeLookupResult, 32)
    with lookup_server(core, worker, kv):
        sched = vllm_core.build_scheduler(core, SETTINGS, connector=core.MooncakeStoreConnector,
                                          kv_transfer=kv)
        try:
            assert type(sched.connector).__module__.endswith("mooncake.store.connector")
            sched.add_request(vllm_core.make_request(core, "r0", list(range(40)), 2, 16))
            out = sched.schedule()
            # The connector asked for the 40-token prompt's 2 full block hashes; the
            # 32 tokens found are loaded synchronously, so 8 are left to compute.
            assert worker.asked == [(40, 2)]
            assert dict(out.num_scheduled_tokens) == {"r0": 8}
            assert sched.requests["r0"].num_computed_tokens == 40
            mro = core.ModelRunnerOutput(req_ids=["r0"], req_id_to_index={"r0": 0},
                                         sampled_token_ids=[[7]])
            outputs = sched.update_from_output(out, mro)
            stats = outputs[0].outputs[0].prefill_stats
            assert (stats.num_external_cached_tokens, stats.num_local_cached_tokens) == (32, 0)
        finally:
            sched.connector.connector_scheduler.client.close()
