"""Golden vectors of vLLM's prefix-cache block hashes and Mooncake store keys.

Usage: golden_vectors.py <unpacked wheel root> <vLLM version>  (JSON on stdout)

Every value is computed by vLLM's own functions, read from the released wheel's
sources with `ast` and executed here, never re-implemented: `sha256`, `sha256_cbor`
(vllm/utils/hashing.py), `init_none_hash`, `hash_block_tokens`,
`generate_block_hash_extra_keys`, `get_request_block_hasher`
(vllm/v1/core/kv_cache_utils.py), `tensor_data` (vllm/v1/utils.py), and the
MooncakeStoreConnector's key code: `KeyMetadata`, `PoolKey`, the store layouts,
`chunk_hashes_for_block_size` and `ChunkedTokenDatabase` (store/data.py), and the
worker's `_select_store_layout`, `_build_token_databases`,
`_init_lookup_key_prefixes`, `lookup` and the key part of `__init__`
(store/worker.py). vLLM is not imported (it needs torch): only what those functions
touch is stubbed (a request object, a KV-cache spec, a store that records the keys
it is asked about, a coordinator whose hit search answers 0).

Strings that reach the hash come from `json.loads`, so each is a distinct object, as
in the engine (msgspec-decoded): pickle then never shares them through its memo.
"""

import __future__
import ast
import bisect
import dataclasses
import hashlib
import importlib.metadata
import json
import math
import os
import pickle
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, NamedTuple, NewType, TypeAlias, TypeVar, cast, overload

import cbor2

SRC, VERSION = sys.argv[1], sys.argv[2]


class _Logger:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Anything:
    """Stands for a module only named in annotations or never-called code."""

    def __getattr__(self, name):
        return _Anything()

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getitem__(self, item):
        return _Anything()


# One module for every extracted definition (dataclasses look their module up), with
# the names they refer to.
MODULE = types.ModuleType("vllm_extract")
sys.modules[MODULE.__name__] = MODULE
NS: dict[str, Any] = MODULE.__dict__
NS.update({
    "Any": Any,
    "Callable": Callable,
    "Iterable": Iterable,
    "Iterator": Iterator,
    "NamedTuple": NamedTuple,
    "NewType": NewType,
    "Sequence": Sequence,
    "TypeAlias": TypeAlias,
    "TypeVar": TypeVar,
    "cast": cast,
    "overload": overload,
    "dataclass": dataclass,
    "dataclasses": dataclasses,
    "field": field,
    "replace": replace,
    "Enum": Enum,
    "bisect": bisect,
    "hashlib": hashlib,
    "math": math,
    "os": os,
    "pickle": pickle,
    "time": time,
    "cbor2": cbor2,
    "logger": _Logger(),
    "np": _Anything(),
    "torch": types.SimpleNamespace(Tensor=object, uint8="uint8", cuda=_Anything()),
    # Only compared by identity in resolve_none_hash_seed: never the sha256 family.
    "xxhash": object(),
    "xxhash_cbor": object(),
})


# Annotations stay unevaluated (they name vLLM types that are not loaded).
FLAGS = __future__.annotations.compiler_flag


def _names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _tree(rel: str) -> tuple[ast.Module, str]:
    path = os.path.join(SRC, "vllm", rel)
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path), path


def extract(rel: str, names: list[str]) -> None:
    """Executes the top-level definitions `names` of vllm/`rel`, in file order."""
    tree, path = _tree(rel)
    picked = [node for node in tree.body if _names(node) & set(names)]
    found = set().union(*(_names(node) for node in picked))
    if missing := set(names) - found:
        raise SystemExit(f"{rel}: not found: {sorted(missing)}")
    exec(compile(ast.Module(body=picked, type_ignores=[]), path, "exec", FLAGS), NS)


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise SystemExit(f"class {name} not found")


def extract_methods(rel: str, cls: str, names: list[str], as_name: str) -> type:
    """A new class holding the methods `names` of class `cls` of vllm/`rel`."""
    tree, path = _tree(rel)
    methods = [
        node
        for node in _class(tree, cls).body
        if isinstance(node, ast.FunctionDef) and node.name in names
    ]
    if missing := set(names) - {m.name for m in methods}:
        raise SystemExit(f"{rel}: {cls}: not found: {sorted(missing)}")
    new = ast.ClassDef(name=as_name, bases=[], keywords=[], body=methods, decorator_list=[])
    module = ast.fix_missing_locations(ast.Module(body=[new], type_ignores=[]))
    exec(compile(module, path, "exec", FLAGS), NS)
    return NS[as_name]


def worker_key_init() -> tuple[Callable, Callable]:
    """The key part of MooncakeStoreWorker.__init__ (from the store-layout selection
    to `_init_lookup_key_prefixes()`) as a function, and the `model_name` expression
    of its KeyMetadata call as a function of `model_config`."""
    tree, path = _tree("distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py")
    init = next(
        n
        for n in _class(tree, "MooncakeStoreWorker").body
        if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    )
    start = next(
        i
        for i, stmt in enumerate(init.body)
        if isinstance(stmt, ast.Assign)
        and "_select_store_layout" in ast.unparse(stmt.value)
    )
    body = init.body[start:]
    if "_init_lookup_key_prefixes" not in ast.unparse(body[-1]):
        raise SystemExit("worker __init__ no longer ends with _init_lookup_key_prefixes")
    args = ast.arguments(
        posonlyargs=[],
        args=[ast.arg(arg=a) for a in ("self", "vllm_config", "model_config", "extra_config")],
        kwonlyargs=[],
        kw_defaults=[],
        defaults=[],
    )
    fn = ast.FunctionDef(name="_init_keys", args=args, body=body, decorator_list=[], returns=None)
    exec(
        compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), path, "exec", FLAGS),
        NS,
    )
    call = next(
        n
        for stmt in body
        for n in ast.walk(stmt)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "KeyMetadata"
    )
    expr = next(k.value for k in call.keywords if k.arg == "model_name")
    lam = ast.Lambda(
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg(arg="model_config")], kwonlyargs=[],
            kw_defaults=[], defaults=[],
        ),
        body=expr,
    )
    model_name = eval(compile(ast.fix_missing_locations(ast.Expression(lam)), path, "eval", FLAGS), NS)
    return NS["_init_keys"], model_name


# --- extraction -------------------------------------------------------------------

extract("utils/math_utils.py", ["cdiv"])
extract("utils/hashing.py", ["sha256", "sha256_cbor"])
extract("v1/utils.py", ["tensor_data"])
extract("multimodal/utils.py", ["get_mm_features_in_window"])
extract(
    "v1/core/kv_cache_utils.py",
    [
        "BlockHash",
        "DEFAULT_NONE_HASH_SEED",
        "_NON_CRYPTO_HASH_FUNCTIONS",
        "resolve_none_hash_seed",
        "init_none_hash",
        "_gen_mm_extra_hash_keys",
        "_gen_lora_extra_hash_keys",
        "_gen_prompt_embeds_extra_hash_keys",
        "generate_block_hash_extra_keys",
        "hash_block_tokens",
        "get_request_block_hasher",
        "generate_lookahead_block_hash_extra_keys",
        "BlockHashListWithBlockSize",
    ],
)
extract("v1/kv_cache_layout.py", ["_DIM_L", "KVCacheLayout"])


# KV-cache specs: only their types and the fields the key code reads matter.
@dataclass
class KVCacheSpec:
    block_size: int
    prefix_cacheable: bool = True


class FullAttentionSpec(KVCacheSpec):
    pass


class MLAAttentionSpec(FullAttentionSpec):
    pass


class SlidingWindowMLASpec(KVCacheSpec):
    pass


class MambaSpec(KVCacheSpec):
    pass


class UniformTypeKVCacheSpecs(KVCacheSpec):
    pass


NS.update(
    FullAttentionSpec=FullAttentionSpec,
    MLAAttentionSpec=MLAAttentionSpec,
    SlidingWindowMLASpec=SlidingWindowMLASpec,
    MambaSpec=MambaSpec,
    UniformTypeKVCacheSpecs=UniformTypeKVCacheSpecs,
    KVCacheSpec=KVCacheSpec,
)

STORE = "distributed/kv_transfer/kv_connector/v1/mooncake/store/"
extract(
    STORE + "data.py",
    [
        "_CompactChunkHashList",
        "chunk_hashes_for_block_size",
        "KeyMetadata",
        "PoolKey",
        "StoreShardId",
        "RankNamespace",
        "StoreLayout",
        "RankLocalStoreLayout",
        "TPShardedStoreLayout",
        "LBHNCStoreLayout",
        "LBNHCStoreLayout",
        "ChunkedTokenDatabase",
        "TailKeyBoundary",
        "MooncakeLookupResult",
    ],
)
extract(STORE + "worker.py", ["resolve_store_tp_size", "_make_mooncake_group_id"])
Coordinator = extract_methods(
    STORE + "coordinator.py",
    "MooncakeStoreCoordinator",
    ["align_lookup_length", "block_hashes_for_spec"],
    "CoordinatorKeys",
)
Worker = extract_methods(
    STORE + "worker.py",
    "MooncakeStoreWorker",
    [
        "_supports_tp_sharded_store_layout",
        "_select_store_layout",
        "_build_token_databases",
        "_spec_tp_replication_factor",
        "_compute_group_tp_replication_factors",
        "_init_lookup_key_prefixes",
        "lookup",
        "_tail_key_boundaries",
    ],
    "WorkerKeys",
)
init_keys, model_name_of = worker_key_init()


class ExternalCachedBlockPool:
    def __init__(self, hash_block_size, exists=None):
        self.exists = exists


NS["ExternalCachedBlockPool"] = ExternalCachedBlockPool


# --- block hashes -----------------------------------------------------------------

HASH_FNS = {"sha256": NS["sha256"], "sha256_cbor": NS["sha256_cbor"]}
DUMPS = {
    "sha256": lambda x: pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL),
    "sha256_cbor": lambda x: cbor2.dumps(x, canonical=True),
}


class FakeTensor:
    """Rows of raw bytes, enough for vLLM's `tensor_data` and slicing by token."""

    def __init__(self, raw: bytes, row: int):
        self.raw, self.row = raw, row

    def __getitem__(self, s: slice) -> "FakeTensor":
        return FakeTensor(self.raw[s.start * self.row : s.stop * self.row], self.row)

    def flatten(self):
        return self

    cpu = contiguous = flatten

    def view(self, dtype):
        return self

    def numpy(self):
        return types.SimpleNamespace(data=memoryview(self.raw))


def make_request(tokens, extra):
    lora = extra.get("lora")
    embeds = extra.get("prompt_embeds")
    return types.SimpleNamespace(
        block_hashes=[],
        num_tokens=len(tokens),
        all_token_ids=tokens,
        lora_request=(
            types.SimpleNamespace(lora_name=lora["name"], lora_path=lora["path"])
            if lora
            else None
        ),
        cache_salt=extra.get("cache_salt"),
        mm_features=[
            types.SimpleNamespace(
                identifier=f["identifier"],
                mm_position=types.SimpleNamespace(offset=f["offset"], length=f["length"]),
            )
            for f in extra.get("mm_features", [])
        ],
        prompt_embeds=(
            FakeTensor(bytes.fromhex(embeds["hex"]), embeds["bytes_per_token"])
            if embeds
            else None
        ),
        _prompt_embeds_per_block_hashes={},
    )


def tokens_of(spec):
    if isinstance(spec, list):
        return spec
    # {"start": a, "step": s, "count": n, "mod": m}: a compact long token list.
    return [(spec["start"] + i * spec["step"]) % spec["mod"] for i in range(spec["count"])]


def hash_case(case, algo, seed):
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed
    fn, dumps = HASH_FNS[algo], DUMPS[algo]
    NS["init_none_hash"](fn)
    inputs: list[bytes] = []

    def recording(x):
        data = dumps(x)
        digest = fn(x)
        assert hashlib.sha256(data).digest() == digest
        inputs.append(data)
        return digest

    tokens = tokens_of(case["tokens"])
    request = make_request(tokens, case.get("extra", {}))
    hasher = NS["get_request_block_hasher"](case["hash_block_size"], recording, 0)
    hashes = hasher(request)
    out = {
        "name": case["name"],
        "algo": algo,
        "pythonhashseed": seed,
        "none_hash": bytes(NS["NONE_HASH"]).hex(),
        "hash_block_size": case["hash_block_size"],
        "tokens": case["tokens"],
        "extra": case.get("extra", {}),
        "block_hashes": [h.hex() for h in hashes],
    }
    if case.get("record_inputs", True):
        out["inputs"] = [d.hex() for d in inputs]
    return out


# --- store keys -------------------------------------------------------------------


class RecordingStore:
    def __init__(self):
        self.asked: list[str] = []

    def batch_is_exist(self, keys):
        self.asked = list(keys)
        return [0] * len(keys)


class FakeCoordinator(Coordinator):
    """The connector's coordinator for full-attention groups: vLLM's own
    `align_lookup_length` and `block_hashes_for_spec`; every lookup mask is None
    (FullAttentionManager.reachable_block_mask); the hit search answers 0 (the
    recording store says no key exists)."""

    def __init__(self, groups, scheduler_block_size, hash_block_size):
        self.kv_cache_groups = groups
        self.lcm_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.enable_partial_hash_hits = False

    def lookup_mask(self, aligned_token_len):
        return tuple(None for _ in self.kv_cache_groups)

    def find_longest_cache_hit(self, block_hashes, max_length, pool):
        return (), 0


SPECS = {"full": FullAttentionSpec, "mla": MLAAttentionSpec}


def key_case(case, hash_pool):
    p = case["parallel"]
    groups = [
        types.SimpleNamespace(kv_cache_spec=SPECS[g["kind"]](g["block_size"]))
        for g in case["groups"]
    ]
    scheduler_block_size = math.lcm(*(g["block_size"] for g in case["groups"]))
    hash_block_size = case["hash_block_size"]
    w = Worker()
    w.tp_size, w.pcp_size, w.dcp_size, w.pp_size = p["tp"], p["pcp"], p["dcp"], p["pp"]
    r = case["rank"]
    w.tp_rank, w.pcp_rank, w.dcp_rank, w.pp_rank = r["tp"], r["pcp"], r["dcp"], r["pp"]
    w.num_kv_head = case["num_kv_heads"]
    layout = NS["KVCacheLayout"][case.get("kv_cache_layout", "LBHNC")]
    w.cache_config = types.SimpleNamespace(get_resolved_kv_cache_layout=lambda: layout)
    w.block_size, w.hash_block_size = scheduler_block_size, hash_block_size
    w.coord = FakeCoordinator(groups, scheduler_block_size, hash_block_size)
    w._kv_cache_groups = groups
    w._capacity_only = False
    w.store = RecordingStore()
    w._record_kv_connector_operation = lambda *a, **k: None
    extra_config = case.get("extra_config", {})
    vllm_config = types.SimpleNamespace(
        kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config=extra_config)
    )
    model_config = types.SimpleNamespace(model=case["model"])
    init_keys(w, vllm_config, model_config, extra_config)

    hashes = [bytes.fromhex(h) for h in hash_pool[: case["num_hashes"]]]
    result = w.lookup(case["num_tokens"], hashes)
    assert result.hit_length == 0
    put_keys, group_ids = [], []
    for db in w.token_dbs:
        for _start, _end, h in db.process_tokens(case["put_tokens"], hashes):
            for shard in db.store_layout.local_shard_ids:
                put_keys.append(db.store_layout.key_for(shard, h))
            group_ids.append(NS["_make_mooncake_group_id"](db.metadata, h.hex()))
    return {
        **case,
        "model_name": w.token_dbs[0].metadata.model_name,
        "store_namespace": w.token_dbs[0].metadata.store_namespace,
        "block_hashes": [h.hex() for h in hashes],
        "lookup_key_prefixes": [list(p) for p in w._lookup_key_prefixes],
        "lookup_keys": w.store.asked,
        "put_keys": put_keys,
        "mooncake_group_ids": group_ids,
    }


# --- cases ------------------------------------------------------------------------

# Parsed from JSON so every string is its own object, as in the engine.
HASH_CASES = json.loads(
    r"""[
  {"name": "no_full_block", "hash_block_size": 16, "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]},
  {"name": "empty", "hash_block_size": 16, "tokens": []},
  {"name": "three_blocks_int_widths", "hash_block_size": 16, "tokens": [
    0, 1, 255, 256, 65535, 65536, 2147483647, 2147483648, 4294967295, 151643, 151644, 42,
    7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
    100000, 200000, 300000, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]},
  {"name": "block_size_1", "hash_block_size": 1, "tokens": [5, 300, 70000]},
  {"name": "block_size_2", "hash_block_size": 2, "tokens": [5, 300, 70000, 0, 1]},
  {"name": "block_size_3", "hash_block_size": 3, "tokens": [5, 300, 70000, 0, 1, 2]},
  {"name": "lora", "hash_block_size": 16,
   "tokens": {"start": 1000, "step": 7, "count": 40, "mod": 151936},
   "extra": {"lora": {"name": "sql-adapter", "path": "/adapters/sql-lora-v2"}}},
  {"name": "cache_salt", "hash_block_size": 16,
   "tokens": {"start": 1000, "step": 7, "count": 40, "mod": 151936},
   "extra": {"cache_salt": "tenant-42"}},
  {"name": "lora_and_cache_salt", "hash_block_size": 16,
   "tokens": {"start": 1000, "step": 7, "count": 48, "mod": 151936},
   "extra": {"lora": {"name": "sql-adapter", "path": "/adapters/sql-lora-v2"},
             "cache_salt": "tenant-42"}},
  {"name": "unicode_cache_salt", "hash_block_size": 16,
   "tokens": {"start": 5, "step": 3, "count": 32, "mod": 151936},
   "extra": {"cache_salt": "r\u00e9gion-\u6771\u4eac-\ud83d\ude80"}},
  {"name": "multimodal", "hash_block_size": 16,
   "tokens": {"start": 9, "step": 13, "count": 64, "mod": 151936},
   "extra": {"mm_features": [
     {"identifier": "img-aaaa1111", "offset": 3, "length": 4},
     {"identifier": "img-bbbb2222", "offset": 9, "length": 20},
     {"identifier": "img-cccc3333", "offset": 40, "length": 2},
     {"identifier": "img-dddd4444", "offset": 44, "length": 3}]}},
  {"name": "multimodal_lora_salt", "hash_block_size": 16,
   "tokens": {"start": 9, "step": 13, "count": 48, "mod": 151936},
   "extra": {"lora": {"name": "vision-lora", "path": "/adapters/vision"},
             "cache_salt": "salt-xyz",
             "mm_features": [{"identifier": "vision-lora:img-eeee5555", "offset": 10, "length": 30}]}},
  {"name": "prompt_embeds", "hash_block_size": 4,
   "tokens": [0, 0, 0, 0, 0, 0, 0, 0, 0],
   "extra": {"prompt_embeds": {"bytes_per_token": 4,
     "hex": "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20212223"}}},
  {"name": "long_salt_out_of_frame", "hash_block_size": 16,
   "tokens": {"start": 1, "step": 1, "count": 32, "mod": 151936},
   "extra": {"cache_salt": "LONG_SALT"}, "record_inputs": false},
  {"name": "large_block_frames", "hash_block_size": 16384,
   "tokens": {"start": 100000, "step": 7919, "count": 32768, "mod": 4294967296},
   "record_inputs": false}
]"""
)
for case in HASH_CASES:
    if case.get("extra", {}).get("cache_salt") == "LONG_SALT":
        # 70,000 bytes: pickle writes a string this long outside any frame.
        case["extra"]["cache_salt"] = "".join(chr(ord("a") + i % 26) for i in range(70000))

KEY_CASES = json.loads(
    """[
  {"name": "one_namespace", "model": "meta-llama/Llama-3.1-8B-Instruct",
   "parallel": {"tp": 1, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 0, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 3, "num_tokens": 50, "put_tokens": 48},
  {"name": "four_namespaces_tp4_cache_prefix", "model": "/models/Qwen3-8B/",
   "extra_config": {"cache_prefix": "tenant-a"},
   "parallel": {"tp": 4, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 2, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 3, "num_tokens": 48, "put_tokens": 48},
  {"name": "four_namespaces_tp2_pp2", "model": "Qwen3-0.6B",
   "parallel": {"tp": 2, "pcp": 1, "dcp": 1, "pp": 2}, "rank": {"tp": 1, "pcp": 0, "dcp": 0, "pp": 1},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 3, "num_tokens": 47, "put_tokens": 32},
  {"name": "eight_namespaces_tp4_pp2", "model": "meta-llama/Llama-3.1-70B",
   "parallel": {"tp": 4, "pcp": 1, "dcp": 1, "pp": 2}, "rank": {"tp": 3, "pcp": 0, "dcp": 0, "pp": 1},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 3, "num_tokens": 49, "put_tokens": 48},
  {"name": "eight_namespaces_pcp2_tp2_pp2", "model": "org/model",
   "parallel": {"tp": 2, "pcp": 2, "dcp": 1, "pp": 2}, "rank": {"tp": 1, "pcp": 1, "dcp": 0, "pp": 0},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 2, "num_tokens": 40, "put_tokens": 32},
  {"name": "eight_namespaces_tp4_dcp2_pp2", "model": "deepseek-ai/DeepSeek-V3",
   "parallel": {"tp": 4, "pcp": 1, "dcp": 2, "pp": 2}, "rank": {"tp": 3, "pcp": 0, "dcp": 1, "pp": 0},
   "num_kv_heads": 1, "groups": [{"kind": "mla", "block_size": 32}], "hash_block_size": 32,
   "num_hashes": 2, "num_tokens": 64, "put_tokens": 64},
  {"name": "eight_namespaces_tp8", "model": "m",
   "parallel": {"tp": 8, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 5, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 2, "num_tokens": 33, "put_tokens": 32},
  {"name": "gqa_replicated_tp8_kv2", "model": "m",
   "parallel": {"tp": 8, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 5, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 2, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 2, "num_tokens": 33, "put_tokens": 32},
  {"name": "mla_tp4_one_namespace", "model": "deepseek-ai/DeepSeek-V2-Lite",
   "parallel": {"tp": 4, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 3, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 1, "groups": [{"kind": "mla", "block_size": 64}], "hash_block_size": 64,
   "num_hashes": 1, "num_tokens": 100, "put_tokens": 64},
  {"name": "hash_block_size_chunks_two_groups", "model": "hybrid/Model-A",
   "parallel": {"tp": 2, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 1, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 4, "groups": [{"kind": "full", "block_size": 64}, {"kind": "full", "block_size": 32}],
   "hash_block_size": 16, "num_hashes": 13, "num_tokens": 210, "put_tokens": 192},
  {"name": "store_tp_shared_lbhnc", "model": "meta-llama/Llama-3.1-8B",
   "extra_config": {"store_tp_size": 8, "cache_prefix": "pool"},
   "parallel": {"tp": 4, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 1, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 2, "num_tokens": 40, "put_tokens": 32},
  {"name": "store_tp_lcm_lbnhc_pp2", "model": "meta-llama/Llama-3.1-8B",
   "extra_config": {"enable_store_tp_lcm": true, "prefill_tp_sizes": [2, 4]},
   "kv_cache_layout": "LBNHC",
   "parallel": {"tp": 2, "pcp": 1, "dcp": 1, "pp": 2}, "rank": {"tp": 1, "pcp": 0, "dcp": 0, "pp": 1},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 2, "num_tokens": 40, "put_tokens": 32},
  {"name": "store_tp_mqa", "model": "m",
   "extra_config": {"store_tp_size": 4},
   "parallel": {"tp": 2, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 1, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 1, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 2, "num_tokens": 40, "put_tokens": 32},
  {"name": "store_tp_unsupported_rank_local_compat", "model": "m",
   "extra_config": {"store_tp_size": 3},
   "kv_cache_layout": "BLHNC",
   "parallel": {"tp": 2, "pcp": 1, "dcp": 1, "pp": 1}, "rank": {"tp": 0, "pcp": 0, "dcp": 0, "pp": 0},
   "num_kv_heads": 8, "groups": [{"kind": "full", "block_size": 16}], "hash_block_size": 16,
   "num_hashes": 2, "num_tokens": 40, "put_tokens": 32}
]"""
)

MODEL_NAMES = json.loads(
    """["meta-llama/Llama-3.1-8B-Instruct", "Qwen3-0.6B", "/models/Qwen3-8B/",
    "/srv/models/llama//", "./local-model", "", "/", "org/sub/dir/name"]"""
)


def main():
    hashes = [hash_case(c, a, s) for a in ("sha256", "sha256_cbor") for s in (None, "0", "vllm-router")
              for c in HASH_CASES]
    # Store-key cases use a real chain: the 16-token blocks of a plain request.
    os.environ.pop("PYTHONHASHSEED", None)
    NS["init_none_hash"](NS["sha256"])
    tokens = [(1000 + 7 * i) % 151936 for i in range(16 * 13)]
    pool = [h.hex() for h in NS["get_request_block_hasher"](16, NS["sha256"], 0)(make_request(tokens, {}))]
    keys = [key_case(c, pool) for c in KEY_CASES]
    model_names = [{"model": m, "model_name": model_name_of(types.SimpleNamespace(model=m))}
                   for m in MODEL_NAMES]
    for case in hashes:
        if case["name"] == "long_salt_out_of_frame":
            # The salt is rebuilt by the reader: the alphabet repeated to this length.
            case["extra"] = {"cache_salt_repeat": "abcdefghijklmnopqrstuvwxyz", "cache_salt_len": 70000}
    json.dump(
        {
            "source": f"vllm=={VERSION} wheel from PyPI, functions extracted by scripts/vllm/golden_vectors.py",
            "python": sys.version.split()[0],
            "cbor2": importlib.metadata.version("cbor2"),
            "block_hashes": hashes,
            "model_names": model_names,
            "store_keys": keys,
        },
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")


main()
