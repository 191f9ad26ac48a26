"""vLLM 0.33.0's scheduler-side Mooncake store code, run from its wheel's sources.

`load_scheduler_classes(wheel, lookup_classes)` takes with `ast` vLLM's own
`MooncakeStoreScheduler` (store/scheduler.py, with its helpers), the scheduler's data
classes (store/data.py), the connector base classes (v1/base.py) and
`MooncakeStoreConnector` (store/connector.py), and runs them with `lookup_classes`
(conftest.load_vllm_classes: vLLM's own `LookupKeyClient` and result types) and
small stand-ins for what needs torch or a GPU: the store coordinator (one
full-attention group, no partial hash hits, no Mamba), the block-size resolver, the
Mamba spec, `NULL_BLOCK_ID`, the logger. Annotations are dropped (they name torch
and engine types the code never calls).

`install_vllm_modules(monkeypatch, classes)` puts them in `sys.modules` under vLLM's
module names, so that `mooncake_lookup.vllm` imports vLLM's connector as it would in
a vLLM process.
"""

import abc
import ast
import enum
import sys
import types
import zipfile
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, NamedTuple, cast

from conftest import STORE, _Logger

V1 = "vllm/distributed/kv_transfer/kv_connector/v1/"
# Source -> top-level names taken from it.
WANTED = {
    V1 + "base.py": [
        "KVConnectorRole", "KVConnectorMetadata", "KVConnectorWorkerMetadata",
        "KVConnectorTransferResults", "SupportsHMA", "KVConnectorBase_V1",
    ],
    STORE + "data.py": [
        "LoadSpec", "RequestTracker", "BoundaryPut", "ReqMeta",
        "MooncakeStoreWorkerMetadata", "MooncakeStoreConnectorMetadata",
    ],
    STORE + "scheduler.py": [
        "_new_req_prefill_tokens", "_partial_tail_non_mamba_puts", "MooncakeStoreScheduler",
    ],
    STORE + "connector.py": ["MooncakeStoreKVEvents", "MooncakeStoreConnector"],
}
# vLLM module name -> names it must offer to `mooncake_lookup` (vllm.py, __init__.py).
MODULES = {
    "vllm.distributed.kv_transfer.kv_connector.v1.base": ["KVConnectorRole", "KVConnectorBase_V1"],
    "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data": [
        "MooncakeLookupResult", "TailKeyBoundary", "LoadSpec",
    ],
    "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector": [
        "MooncakeStoreConnector",
    ],
    # What the connector's `_validate_kv_cache_config` imports.
    "vllm.v1.kv_cache_interface": ["CrossAttentionSpec", "MambaSpec"],
}


class _NoAnnotations(ast.NodeTransformer):
    """Drops function annotations and makes every variable annotation `Any` (a
    dataclass field keeps its name; its type is never evaluated)."""

    def visit_FunctionDef(self, node):  # noqa: N802 - ast's name
        self.generic_visit(node)
        node.returns = None
        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                  node.args.vararg, node.args.kwarg]:
            if a is not None:
                a.annotation = None
        return node

    def visit_AnnAssign(self, node):  # noqa: N802
        node.annotation = ast.Name("Any", ast.Load())
        return node


def _top_level(source, names):
    tree = ast.fix_missing_locations(_NoAnnotations().visit(ast.parse(source)))
    out = [n for n in tree.body if getattr(n, "name", None) in names]
    found = {n.name for n in out}
    assert found == set(names), f"vLLM 0.33.0's sources lack {sorted(set(names) - found)}"
    return out


class _Coordinator:
    """Stand-in for `MooncakeStoreCoordinator` (it imports vLLM's block pool and KV
    cache managers): what the scheduler reads of it for one full-attention group
    without partial hash hits, EAGLE or Mamba."""

    def __init__(self, kv_cache_config, block_size):
        self.kv_cache_groups = list(kv_cache_config.prefix_cacheable_groups)
        self.enable_partial_hash_hits = False
        self.hash_block_size = block_size
        self.lcm_block_size = block_size
        self.mamba_group_ids = frozenset()
        self.use_eagle = False
        self.eagle_proof_margin_by_group = {}

    @classmethod
    def from_kv_cache_config(cls, kv_cache_config, vllm_config, scheduler_block_size, hash_block_size):
        return cls(kv_cache_config, scheduler_block_size)


class _MambaSpec:
    """Stand-in for `MambaSpec`: no group is one."""


class _CrossAttentionSpec:
    """Stand-in for `CrossAttentionSpec`: no group is one."""


def _resolve_block_sizes(kv_cache_config, vllm_config):
    """`resolve_kv_cache_block_sizes` for one group: (scheduler block size, hash block
    size), both the cache config's block size."""
    bs = vllm_config.cache_config.block_size
    return bs, bs


def load_scheduler_classes(wheel, lookup_classes):
    """The names of WANTED (and `lookup_classes`'s), run from `wheel`'s sources."""
    ns = {
        "__name__": "vllm_store_scheduler",
        "ABC": abc.ABC, "abstractmethod": abc.abstractmethod, "enum": enum,
        "dataclass": dataclass, "field": field, "replace": replace,
        "NamedTuple": NamedTuple, "cast": cast, "Any": Any,
        "Sequence": Sequence, "Iterable": Iterable, "Callable": Callable,
        "AbstractContextManager": AbstractContextManager,
        "Counter": __import__("collections").Counter,
        "TYPE_CHECKING": False, "logger": _Logger(),
        "cdiv": lambda a, b: -(a // -b), "NULL_BLOCK_ID": 0,
        "MooncakeStoreCoordinator": _Coordinator, "MambaSpec": _MambaSpec,
        "resolve_kv_cache_block_sizes": _resolve_block_sizes,
        "get_mamba_prefill_checkpoint_position": lambda *a: 0,
        "MooncakeStoreWorker": None, "BlockStored": None, "KVConnectorKVEvents": object,
        "KVConnectorStats": None, "KVConnectorPromMetrics": None, "PromMetric": None,
        "PromMetricT": None, "MooncakeStoreConnectorStats": None,
        "MooncakeStorePromMetrics": None,
        "CacheHitSource": SimpleNamespace(EXTERNAL_UNSPECIFIED="external_unspecified"),
    }
    for name in ("LookupKeyClient", "MooncakeLookupResult", "TailKeyBoundary"):
        ns[name] = getattr(lookup_classes, name)
    with zipfile.ZipFile(wheel) as z:
        for name, wanted in WANTED.items():
            module = ast.Module(body=_top_level(z.read(name).decode(), wanted), type_ignores=[])
            exec(compile(module, f"vllm-0.33.0/{name}", "exec"), ns)  # noqa: S102
    names = [k for names in WANTED.values() for k in names]
    names += ["LookupKeyClient", "MooncakeLookupResult", "TailKeyBoundary"]
    return SimpleNamespace(
        **{k: ns[k] for k in names}, logger=ns["logger"], MambaSpec=_MambaSpec,
        CrossAttentionSpec=_CrossAttentionSpec)


def install_vllm_modules(monkeypatch, classes):
    """vLLM's module names in `sys.modules`, with the names of MODULES from
    `classes`; `mooncake_lookup.vllm` is dropped so that the next import reads them."""
    for full, names in MODULES.items():
        parts = full.split(".")
        for i in range(1, len(parts)):
            pkg = ".".join(parts[:i])
            if pkg not in sys.modules:
                package = types.ModuleType(pkg)
                package.__path__ = []
                monkeypatch.setitem(sys.modules, pkg, package)
        module = types.ModuleType(full)
        for name in names:
            setattr(module, name, getattr(classes, name))
        monkeypatch.setitem(sys.modules, full, module)
    monkeypatch.delitem(sys.modules, "mooncake_lookup.vllm", raising=False)
