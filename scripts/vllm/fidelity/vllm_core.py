"""vLLM 0.33.0's own scheduler, KV cache manager and block pool, loaded from its wheel
on a CPU machine without torch.

`load(wheel)` imports, through `wheel_import.WheelImporter`, these modules of the wheel
verbatim (VERBATIM): the scheduler (v1/core/sched/scheduler.py with its request queue,
output and utils), the KV cache manager, the KV cache coordinator, the single-type
managers, the block pool, kv_cache_utils (block hashing, KVCacheBlock,
FreeKVCacheBlockQueue), the request, the KV cache specs, the model-runner output
types, the engine output types (msgspec), the stats dataclasses and the KV connector
base classes. A few modules run partly (PARTIAL: the wheel's own definitions, minus
those that need torch, PIL, ZeroMQ or cbor2), and the rest of what they import is
stood in (STANDINS, see standins.py: each needs torch, a GPU, Prometheus, pydantic
model configs, multimodal processing or structured output, and takes no scheduling
decision). It returns a namespace of vLLM's classes.

`build_scheduler(core, settings, connector=None)` builds vLLM's `Scheduler` from
plain settings (the scenario's, see harness.py), with an optional
scheduler-side KV connector instance (any `KVConnectorBase_V1`, for example vLLM's
own MooncakeStoreConnector loaded with `load(wheel, extra_verbatim=...)`).
`make_request(core, ...)` builds a vLLM `Request` with vLLM's block hasher (sha256,
the default `prefix_caching_hash_algo`).

`SchedulerConfig` and `CacheConfig` are plain objects holding every field of vLLM's
dataclasses with the wheel's own defaults (read from vllm/config/scheduler.py and
cache.py with `ast`: `scheduler_reserve_full_isl` = True, `watermark` = 0.0, ...),
overridden by the settings; SchedulerConfig's own __post_init__ and
verify_max_model_len then run on them (vLLM's code, taken with `ast`), pydantic's
field validation does not.

Needs: Python >= 3.11, `msgspec` and `numpy` from PyPI (vLLM's engine and output
types use them); no torch.
"""

import ast
import sys
import types
import zipfile
from types import SimpleNamespace

import standins as si
from wheel_import import Partial, WheelImporter, class_methods

VERBATIM = [
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.sched.async_scheduler",
    "vllm.v1.core.sched.request_queue",
    "vllm.v1.core.sched.output",
    "vllm.v1.core.sched.utils",
    "vllm.v1.core.sched.interface",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.kv_cache_metrics",
    "vllm.v1.core.encoder_cache_manager",
    "vllm.v1.hisparse.block_pool",
    "vllm.v1.request",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.outputs",
    "vllm.v1.engine",
    "vllm.v1.metrics.stats",
    "vllm.v1.metrics.cache_hit_source",
    "vllm.utils.math_utils",
    "vllm.exceptions",
    "vllm.distributed.kv_transfer.kv_connector.v1.base",
]

PARTIAL = {
    "vllm.utils": Partial(keep=frozenset({"length_from_prompt_token_ids_or_embeds"}),
                          prelude=si.utils_package_prelude),
    "vllm.utils.hashing": Partial(drop_imports=("cbor2",), prelude=si.hashing_prelude),
    "vllm.v1.utils": Partial(
        keep=frozenset({"T", "ConstantList", "_PROFILER_FUNC", "record_function_or_nullcontext"}),
        prelude=si.v1_utils_prelude),
    "vllm.multimodal.utils": Partial(
        keep=frozenset({"get_mm_features_in_window", "strip_covered_mm_data"}),
        prelude=si.multimodal_utils_prelude),
    "vllm.outputs": Partial(keep=frozenset({"RequestError"}), prelude=si.outputs_prelude),
    "vllm.distributed.kv_events": Partial(
        drop=frozenset({"ZmqEventPublisher"}),
        drop_imports=("zmq", "vllm.utils.network_utils", "vllm.config.kv_events"),
        prelude=si.kv_events_prelude),
    "vllm.v1.attention.backends.registry": Partial(
        drop_imports=("vllm.utils.import_utils",),
        prelude=lambda m: setattr(m, "resolve_obj_by_qualname", si.StandInCalled)),
}

STANDINS = {
    "torch": si.torch,
    "vllm.logger": si.logger,
    "vllm.envs": si.envs,
    "vllm.config": si.config,
    "vllm.config.kv_events": si.config_kv_events,
    "vllm.config.ec_manager_config": si.config_ec_manager,
    "vllm.compilation.cuda_graph": si.cuda_graph,
    "vllm.v1.metrics.perf": si.metrics_perf,
    "vllm.v1.spec_decode.metrics": si.spec_decode_metrics,
    "vllm.v1.spec_decode.dynamic.utils": si.spec_decode_dynamic,
    "vllm.distributed.kv_transfer.kv_connector.v1.metrics": si.kv_connector_metrics,
    "vllm.distributed.kv_transfer.kv_connector.factory": si.kv_connector_factory,
    "vllm.distributed.kv_transfer.kv_connector.v1": si.kv_connector_v1,
    "vllm.distributed.ec_transfer.ec_connector.base": si.ec_connector_base,
    "vllm.distributed.ec_transfer.ec_connector.factory": si.ec_connector_factory,
    "vllm.distributed.ec_transfer.ec_connector.metrics": si.ec_connector_metrics,
    "vllm.distributed.aux_output_connector.connector": si.aux_output_connector,
    "vllm.v1.structured_output": si.structured_output,
    "vllm.v1.structured_output.request": si.structured_output_request,
    "vllm.v1.structured_output.utils": si.structured_output_utils,
    "vllm.lora.request": si.lora_request,
    "vllm.pooling_params": si.pooling_params,
    "vllm.sampling_params": si.sampling_params,
    "vllm.multimodal": si.multimodal,
    "vllm.multimodal.inputs": si.multimodal_inputs,
    "vllm.multimodal.encoder_budget": si.multimodal_budget,
    "vllm.v1.kv_hints": si.kv_hints,
    "vllm.v1.serial_utils": si.serial_utils,
    "vllm.utils.torch_utils": si.torch_utils,
    "vllm.v1.attention.backend": si.attention_backend,
    "vllm.platforms": si.platforms,
}


def load(wheel, extra_verbatim=(), extra_partial=None, extra_standins=None):
    """vLLM 0.33.0's scheduling classes, run from `wheel` (path of the .whl).

    `extra_*` add modules (for example a connector's) to VERBATIM / PARTIAL /
    STANDINS. Installs the importer on `sys.meta_path` (drops `vllm`/`torch` modules
    already imported). Raises ImportError naming a module that is neither taken from
    the wheel nor stood in.
    """
    for package in ("msgspec", "numpy"):
        try:
            __import__(package)
        except ImportError as e:
            raise ImportError(f"vLLM 0.33.0's engine and output types need {package}: "
                              f"pip install msgspec numpy (see scripts/vllm/fidelity/test.sh)"
                              ) from e
    # A module named in an extra_* argument replaces its entry elsewhere.
    extra_partial, extra_standins = extra_partial or {}, extra_standins or {}
    named = {*extra_verbatim, *extra_partial, *extra_standins}
    verbatim = [m for m in VERBATIM if m not in named] + list(extra_verbatim)
    partial = {k: v for k, v in PARTIAL.items() if k not in named} | extra_partial
    standins = {k: v for k, v in STANDINS.items() if k not in named} | extra_standins
    importer = WheelImporter(wheel, verbatim, partial, standins).install()
    from vllm.distributed.kv_transfer.kv_connector.v1 import base as connector_base
    from vllm.utils import hashing
    from vllm.v1 import kv_cache_interface as kvi
    from vllm.v1 import outputs, request
    from vllm.v1.core import block_pool, kv_cache_manager, kv_cache_utils
    from vllm.v1.core.sched import async_scheduler, scheduler
    from vllm.v1.core.sched import output as sched_output

    with zipfile.ZipFile(wheel) as z:
        defaults = {cls: dataclass_defaults(z, f"vllm/config/{f}.py", cls)
                    for f, cls in CONFIGS}
        scheduler_checks = class_methods(
            z, "vllm/config/scheduler.py", "SchedulerConfig",
            ["__post_init__", "verify_max_model_len"],
            {"logger": sys.modules["vllm.logger"].init_logger("vllm.config.scheduler")})
    return SimpleNamespace(
        wheel=wheel, importer=importer,
        Scheduler=scheduler.Scheduler, AsyncScheduler=async_scheduler.AsyncScheduler,
        KVCacheManager=kv_cache_manager.KVCacheManager,
        BlockPool=block_pool.BlockPool, Request=request.Request,
        RequestStatus=request.RequestStatus, SchedulerOutput=sched_output.SchedulerOutput,
        ModelRunnerOutput=outputs.ModelRunnerOutput,
        KVConnectorOutput=outputs.KVConnectorOutput,
        KVCacheConfig=kvi.KVCacheConfig, KVCacheGroupSpec=kvi.KVCacheGroupSpec,
        FullAttentionSpec=kvi.FullAttentionSpec, kv_cache_utils=kv_cache_utils,
        sha256=hashing.sha256, SamplingParams=sys.modules["vllm.sampling_params"].SamplingParams,
        KVConnectorBase_V1=connector_base.KVConnectorBase_V1,
        KVConnectorRole=connector_base.KVConnectorRole,
        KVConnectorMetadata=connector_base.KVConnectorMetadata,
        config_defaults=defaults, scheduler_config_methods=scheduler_checks,
    )


# (file under vllm/config, class): the config dataclasses whose defaults are read.
CONFIGS = [("scheduler", "SchedulerConfig"), ("cache", "CacheConfig"), ("model", "ModelConfig"),
           ("parallel", "ParallelConfig"), ("observability", "ObservabilityConfig"),
           ("kv_transfer", "KVTransferConfig")]


def dataclass_defaults(z, path, cls):
    """Field name -> default of the config dataclass `cls` in the wheel's `path`, for
    the fields whose default is a literal, `Field(default=literal)` or a ClassVar
    constant of the class (InitVars and factories are left out)."""
    tree = ast.parse(z.read(path).decode())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    consts, out = {}, {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name, ann, value = stmt.target.id, ast.unparse(stmt.annotation), stmt.value
        if value is None or ann.startswith("InitVar"):
            continue
        if isinstance(value, ast.Call) and ast.unparse(value.func) in ("Field", "field"):
            kw = {k.arg: k.value for k in value.keywords}
            if "default" not in kw:
                continue
            value = kw["default"]
        try:
            v = consts[value.id] if isinstance(value, ast.Name) and value.id in consts \
                else ast.literal_eval(value)
        except ValueError:
            continue
        (consts if ann.startswith("ClassVar") else out)[name] = v
    return out


class Strict(SimpleNamespace):
    """A settings object that names the missing field instead of reading None."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"{self.__dict__.get('_what', 'config')} has no field {name!r}: "
                             "add it in vllm_core.vllm_config")


def kv_transfer_config(core, **fields):
    """vLLM's KVTransferConfig fields (the wheel's defaults), with `fields` over them:
    by default kv_role "kv_both" (producer and consumer, as the Mooncake store
    connector runs), connector "MooncakeStoreConnector", kv_load_failure_policy as
    vLLM defaults it. `is_kv_producer` / `is_kv_consumer` follow kv_role as
    KVTransferConfig's properties do (config/kv_transfer.py line 131)."""
    cfg = {**core.config_defaults["KVTransferConfig"], "kv_role": "kv_both",
           "kv_connector": "MooncakeStoreConnector", "kv_connector_extra_config": {},
           **fields, "_what": "KVTransferConfig"}
    cfg["is_kv_producer"] = cfg["kv_connector"] is not None and cfg["kv_role"] in (
        "kv_producer", "kv_both")
    cfg["is_kv_consumer"] = cfg["kv_connector"] is not None and cfg["kv_role"] in (
        "kv_consumer", "kv_both")
    cfg["get_from_extra_config"] = lambda key, default: cfg["kv_connector_extra_config"].get(
        key, default)
    return Strict(**cfg)


def vllm_config(core, s, with_connector, kv_transfer=None):
    """The `VllmConfig` fields vLLM's Scheduler reads, for a text-only decoder model
    without spec decode, LoRA, pipeline or data parallelism. `s`: the scenario's
    settings (dict); `kv_transfer`: fields over kv_transfer_config's."""
    d = core.config_defaults
    sched = {**d["SchedulerConfig"], "_what": "SchedulerConfig"}
    for k in ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
              "long_prefill_token_threshold", "async_scheduling",
              "scheduler_reserve_full_isl"):
        if k in s:
            sched[k] = s[k]
    sched.setdefault("max_num_scheduled_tokens", None)
    scheduler_config = Strict(**sched)
    # vLLM's own SchedulerConfig.__post_init__ (config/scheduler.py line 295): derived
    # fields and verify_max_model_len's checks (ValueError on a bad combination).
    methods = core.scheduler_config_methods
    scheduler_config.verify_max_model_len = types.MethodType(
        methods["verify_max_model_len"], scheduler_config)
    methods["__post_init__"](scheduler_config, s["max_model_len"], False)
    cache = {**d["CacheConfig"], "_what": "CacheConfig",
             "block_size": s["block_size"], "num_gpu_blocks": s["num_gpu_blocks"] + 1,
             "enable_prefix_caching": s["enable_prefix_caching"]}
    cfg = Strict(
        _what="VllmConfig",
        scheduler_config=scheduler_config, cache_config=Strict(**cache),
        lora_config=None, kv_events_config=None, speculative_config=None,
        ec_transfer_config=None,
        kv_transfer_config=(kv_transfer_config(core, **(kv_transfer or {}))
                            if with_connector else None),
        # ModelConfig's properties (uses_mrope, is_encoder_decoder, ...) come from the
        # Hugging Face config in vLLM: here a text-only decoder.
        model_config=Strict(**{**d["ModelConfig"], "_what": "ModelConfig", "uses_mrope": False,
                               "is_encoder_decoder": False, "max_model_len": s["max_model_len"],
                               "runner_type": "generate", "is_diffusion": False,
                               "supports_multimodal_inputs": False}),
        parallel_config=Strict(**{**d["ParallelConfig"], "_what": "ParallelConfig",
                                  "data_parallel_index": 0, "world_size": 1}),
        observability_config=Strict(**{**d["ObservabilityConfig"],
                                       "_what": "ObservabilityConfig"}),
        ec_manager_config=si.NoEncoderCacheManagerConfig(),
        aux_output_config=Strict(_what="AuxOutputConfig", enabled=False),
        # VllmConfig.max_concurrent_batches (config/vllm.py line 588): 2 with async
        # scheduling (V1 model runner, no pipeline parallelism), else 1.
        is_mm_encoder_only=False, max_concurrent_batches=2 if sched["async_scheduling"] else 1,
        num_speculative_tokens=0,
        num_lookahead_tokens=0, num_prefill_lookahead_tokens=0, use_v2_model_runner=False,
        num_hash_lookahead_tokens=0, max_in_flight_tokens=None,
    )
    return cfg


def kv_cache_config(core, s):
    """One full-attention group over `num_gpu_blocks + 1` blocks: vLLM's block pool
    keeps block 0 as the null block, so `num_gpu_blocks` are usable."""
    spec = core.FullAttentionSpec(block_size=s["block_size"], num_kv_heads=1, head_size=64,
                                  dtype=sys.modules["torch"].float16)
    return core.KVCacheConfig(num_blocks=s["num_gpu_blocks"] + 1, kv_cache_tensors=[],
                              kv_cache_groups=[core.KVCacheGroupSpec(["layer.0"], spec)])


def build_scheduler(core, settings, connector=None, log_stats=False, kv_transfer=None):
    """vLLM's `Scheduler`, or `AsyncScheduler` when settings["async_scheduling"] (as
    SchedulerConfig.get_scheduler_cls picks), for `settings` (the scenario's
    "settings" dict: block_size,
    num_gpu_blocks, max_num_seqs, max_num_batched_tokens, max_model_len,
    enable_chunked_prefill, enable_prefix_caching, long_prefill_token_threshold,
    async_scheduling, scheduler_reserve_full_isl), with `connector`: None (no KV
    transfer), a scheduler-role KVConnectorBase_V1 instance, or a class or function
    called as vLLM's KVConnectorFactory calls a connector class,
    `connector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)` (a connector's
    __init__ reads the config the scheduler is built with). The KV transfer config is
    `kv_transfer_config(core, **kv_transfer)`."""
    si.ConnectorSlot.connector = connector
    # SchedulerConfig.get_scheduler_cls (config/scheduler.py line 231).
    cls = core.AsyncScheduler if settings.get("async_scheduling") else core.Scheduler
    try:
        cfg = vllm_config(core, settings, connector is not None, kv_transfer)
        scheduler = cls(
            vllm_config=cfg, kv_cache_config=kv_cache_config(core, settings),
            structured_output_manager=sys.modules["vllm.v1.structured_output"]
            .StructuredOutputManager(),
            block_size=settings["block_size"], log_stats=log_stats)
    finally:
        si.ConnectorSlot.connector = None
    return scheduler


_hashers = {}


def make_request(core, request_id, prompt_token_ids, max_tokens, block_size, arrival_time=0.0):
    """A vLLM `Request` that samples `max_tokens` tokens, with vLLM's block hasher
    (kv_cache_utils.get_request_block_hasher over sha256, NONE_HASH from
    init_none_hash, as EngineCore sets them up)."""
    if block_size not in _hashers:
        core.kv_cache_utils.init_none_hash(core.sha256)
        _hashers[block_size] = core.kv_cache_utils.get_request_block_hasher(block_size, core.sha256)
    return core.Request(
        request_id=request_id, prompt_token_ids=list(prompt_token_ids),
        sampling_params=core.SamplingParams(max_tokens=max_tokens), pooling_params=None,
        arrival_time=arrival_time, block_hasher=_hashers[block_size])
