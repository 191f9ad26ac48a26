"""vLLM 0.33.0's own MooncakeStoreConnector (scheduler side) runs inside vLLM's own
Scheduler, loaded by mooncake_store.load, and asks vLLM's own LookupKeyServer over
real ZeroMQ."""

import contextlib
import os

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


def test_vllms_store_connector_loads_the_stores_hit_synchronously(store_core, tmp_path,
                                                                   monkeypatch):
    core = store_core
    monkeypatch.setattr(core.get_zmq_rpc_path_lookup.__globals__["envs"],
                        "VLLM_RPC_BASE_PATH", str(tmp_path))
    kv = {"kv_connector_extra_config": {"lookup_rpc_port": os.getpid(), "load_async": False}}
    worker = StoreWorker(core.MooncakeLookupResult, 32)
    server = core.LookupKeyServer(worker, vllm_core.vllm_config(core, SETTINGS, True, kv))
    sched = None
    try:
        sched = vllm_core.build_scheduler(core, SETTINGS, connector=core.MooncakeStoreConnector,
                                          kv_transfer=kv)
        assert type(sched.connector).__module__.endswith("mooncake.store.connector")
        sched.add_request(vllm_core.make_request(core, "r0", list(range(40)), 2, 16))
        out = sched.schedule()
        # The connector asked for the 40-token prompt's 2 full block hashes; the 32
        # tokens found are loaded synchronously, so 8 are left to compute.
        assert worker.asked == [(40, 2)]
        assert dict(out.num_scheduled_tokens) == {"r0": 8}
        assert sched.requests["r0"].num_computed_tokens == 40
        mro = core.ModelRunnerOutput(req_ids=["r0"], req_id_to_index={"r0": 0},
                                     sampled_token_ids=[[7]])
        outputs = sched.update_from_output(out, mro)
        stats = outputs[0].outputs[0].prefill_stats
        assert (stats.num_external_cached_tokens, stats.num_local_cached_tokens) == (32, 0)
    finally:
        # vLLM's server thread blocks in recv: let it answer one last lookup, then
        # close its socket from here (closing it under the thread aborts libzmq).
        server.running = False
        if server.thread.is_alive():
            path = core.get_zmq_rpc_path_lookup(vllm_core.vllm_config(core, SETTINGS, True, kv))
            stop = zmq.Context.instance().socket(zmq.REQ)
            stop.setsockopt(zmq.LINGER, 0)
            stop.setsockopt(zmq.RCVTIMEO, 5000)
            stop.connect(path)
            stop.send_multipart([b"stop"])  # an unknown tag: vLLM's server answers RESP_ERR
            with contextlib.suppress(zmq.Again):
                stop.recv()
            stop.close()
            server.thread.join(5)
        assert not server.thread.is_alive()
        server.close()
        if sched is not None:
            sched.connector.connector_scheduler.client.close()
