"""vLLM 0.33.0's own MooncakeStoreConnector (scheduler side) on top of vllm_core.

`load(wheel)` is `vllm_core.load` plus the Mooncake store connector's modules, run
from the wheel: store/connector.py, store/scheduler.py (MooncakeStoreScheduler),
store/coordinator.py (MooncakeStoreCoordinator, over vLLM's own KV cache managers),
store/data.py and store/protocol.py verbatim; store/worker.py in part (the lookup
channel: LookupKeyClient, LookupKeyServer, get_zmq_rpc_path_lookup; the worker
itself moves KV with torch and the Mooncake client, so MooncakeStoreWorker is an
empty class); the connector metrics base classes minus Prometheus; network_utils
verbatim. Needs pyzmq, psutil and urllib3 (PyPI) on top of vllm_core's msgspec and
numpy. The lookup channel is real ZeroMQ (pyzmq), so a scheduler built with
`connector=MooncakeStoreConnector` asks a lookup server at
`get_zmq_rpc_path_lookup(vllm_config)`: vLLM's own LookupKeyServer (worker rank 0)
or the project's lookup-server.

`vllm_core.build_scheduler(..., kv_transfer={...})` sets the KV transfer config
fields the connector reads (`kv_connector_extra_config`: lookup_rpc_port,
load_async, lookup_async, ...) over vLLM's defaults (vllm_core.kv_transfer_config).
"""

import importlib

import standins as si
import vllm_core
from wheel_import import Partial

STORE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store"

VERBATIM = [f"{STORE}.connector", f"{STORE}.scheduler", f"{STORE}.coordinator",
            f"{STORE}.data", f"{STORE}.protocol", f"{STORE}.metrics",
            "vllm.utils.network_utils"]


def _worker_prelude(module):
    """MooncakeStoreWorker moves KV blocks with torch and the Mooncake client (worker
    role only): an empty class; the lookup channel's classes run verbatim."""
    si.placeholder(module, "MooncakeStoreWorker")


def _metrics_prelude(module):
    """Prometheus metric classes: annotations of the Prometheus helpers (log_stats
    off); KVConnectorStats (a dataclass) runs verbatim."""
    si.placeholder(module, "Gauge", "Counter", "Histogram")


PARTIAL = {
    f"{STORE}.worker": Partial(
        keep=frozenset({"logger", "LookupKeyServer", "LookupKeyClient", "get_zmq_rpc_path_lookup"}),
        imports=True, prelude=_worker_prelude,
        drop_imports=("vllm.distributed.mooncake_store", "vllm.distributed.kv_transfer."
                      "kv_connector.v1.mooncake.rdma_utils")),
    "vllm.distributed.kv_transfer.kv_connector.v1.metrics": Partial(
        keep=frozenset({"logger", "PromMetric", "PromMetricT", "KVConnectorStats",
                        "KVConnectorPromMetrics"}),
        imports=True, prelude=_metrics_prelude,
        drop_imports=("prometheus_client", "vllm.distributed.kv_transfer.kv_connector.factory")),
    "vllm.v1.attention.backends.utils": Partial(keep=frozenset({"NULL_BLOCK_ID"})),
}


def _distributed(module):
    """vllm.distributed (package init): tensor-parallel groups over torch.distributed;
    the worker's lookup channel reads none of it (the rank helpers the worker imports
    raise when called)."""
    module.__path__ = []
    si.refuse(module, "get_dcp_group", "get_pcp_group", "get_tensor_model_parallel_rank",
               "get_tensor_model_parallel_world_size", "get_pp_group", "get_world_group",
               "get_tp_group")


def _forward_context(module):
    """vllm.forward_context: the model forward's context (worker role); annotation."""
    si.placeholder(module, "ForwardContext")


STANDINS = {"vllm.distributed": _distributed, "vllm.forward_context": _forward_context}


def load(wheel):
    """vllm_core.load's namespace plus `MooncakeStoreConnector`,
    `MooncakeStoreScheduler`, `LookupKeyClient`, `LookupKeyServer`,
    `MooncakeLookupResult`, `MooncakeStoreWorkerMetadata`, `get_zmq_rpc_path_lookup`
    (vLLM's own)."""
    for package in ("zmq", "psutil", "urllib3"):
        try:
            __import__(package)
        except ImportError as e:
            raise ImportError(f"vLLM's lookup channel needs {package}: pip install "
                              "pyzmq==27.3.0 psutil==7.2.2 urllib3==2.5.0") from e
    core = vllm_core.load(wheel, extra_verbatim=VERBATIM, extra_partial=PARTIAL,
                          extra_standins=STANDINS)
    connector, scheduler, worker, data = (
        importlib.import_module(f"{STORE}.{m}")
        for m in ("connector", "scheduler", "worker", "data"))
    core.MooncakeStoreConnector = connector.MooncakeStoreConnector
    core.MooncakeStoreScheduler = scheduler.MooncakeStoreScheduler
    core.LookupKeyClient = worker.LookupKeyClient
    core.LookupKeyServer = worker.LookupKeyServer
    core.get_zmq_rpc_path_lookup = worker.get_zmq_rpc_path_lookup
    core.MooncakeLookupResult = data.MooncakeLookupResult
    core.MooncakeStoreWorkerMetadata = data.MooncakeStoreWorkerMetadata
    return core
