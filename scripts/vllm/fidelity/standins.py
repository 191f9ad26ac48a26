"""Stand-ins for the few names vLLM 0.33.0's scheduling modules import that need torch,
a GPU, Prometheus, pydantic models, multimodal processing or structured output.

Each function fills one module (`WheelImporter` calls it with the empty module). Each
says why the real module is not run and what the scheduling code reads of it. No
stand-in takes a scheduling decision: the scheduler, KV cache manager, block pool,
coordinator, single-type managers, request and free-block queue are vLLM's own code
(see vllm_core.VERBATIM). Names that are only annotations or `isinstance` targets are
empty classes (`placeholder`); a stand-in that would have to compute something the
scenario never asks for raises `StandInCalled` instead of guessing.
"""

import contextlib
import enum
import logging
import os
import sys
import tempfile
import types
from dataclasses import dataclass, field
from typing import Any


class StandInCalled(RuntimeError):
    """A stood-in vLLM name was used for more than its type: the scenario needs a
    feature (torch tensors, spec decode, structured output, ...) the harness lacks."""


def placeholder(module, *names):
    """Empty classes named `names` in `module` (annotations and isinstance only)."""
    for name in names:
        setattr(module, name, type(name, (), {"__module__": module.__name__}))


def refuse(module, *names):
    """Functions named `names` in `module` that raise StandInCalled when called."""
    for name in names:
        def refuse(*args, _name=name, **kwargs):
            raise StandInCalled(f"{module.__name__}.{_name} is stood in (see standins.py)")
        refuse.__name__ = name
        setattr(module, name, refuse)


# torch ------------------------------------------------------------------------------
class _TorchName(type):
    """A torch name that is only an annotation: `torch.cuda.Event | None` builds, a
    call raises StandInCalled."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _TorchName(f"{cls.__name__}.{name}", (), {})

    def __call__(cls, *args, **kwargs):
        raise StandInCalled(f"{cls.__name__} is stood in: install torch for tensors")


def torch(module):
    """torch: the scheduling modules name `torch.Tensor`/`torch.dtype` in annotations
    and dataclass fields (prompt embeddings, logprob tensors, layer specs' dtypes), which
    a text-only CPU run never fills. Any other attribute is a `_TorchName`."""
    placeholder(module, "Tensor", "dtype", "device", "Generator", "Size")
    for name in ("float16", "bfloat16", "float32", "float", "int", "int32", "int64",
                 "uint8", "long", "bool", "float8_e4m3fn", "float8_e5m2"):
        setattr(module, name, module.dtype())

    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _TorchName(f"torch.{name}", (), {})
    module.__getattr__ = getattr_


# vllm.logger, vllm.envs ---------------------------------------------------------------
class _Logger(logging.Logger):
    """vLLM's logger adds `*_once` methods (vllm/logger.py); they log every time here."""

    def info_once(self, msg, *args, **kwargs):
        kwargs.pop("scope", None)
        self.info(msg, *args, **kwargs)

    def warning_once(self, msg, *args, **kwargs):
        kwargs.pop("scope", None)
        self.warning(msg, *args, **kwargs)

    def debug_once(self, msg, *args, **kwargs):
        kwargs.pop("scope", None)
        self.debug(msg, *args, **kwargs)


def logger(module):
    """vllm.logger: its module configures handlers from envs; only `init_logger` is
    read, returning a logger with vLLM's `*_once` methods."""
    def init_logger(name):
        log = _Logger(name)
        log.parent = logging.getLogger("vllm")
        return log
    module.init_logger = init_logger


# What vllm/envs.py gives for the variables the loaded modules read (vLLM 0.33.0,
# lines 17-289 and 732-2025): the default when unset; VLLM_RPC_BASE_PATH, read from the
# environment as vLLM reads it (the lookup channel's ipc folder).
ENVS = {
    "VLLM_RPC_BASE_PATH": os.getenv("VLLM_RPC_BASE_PATH", tempfile.gettempdir()),
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": True,
    "VLLM_COMPUTE_NANS_IN_LOGITS": False,
    "VLLM_CUSTOM_SCOPES_FOR_PROFILING": False,
    "VLLM_NVTX_SCOPES_FOR_PROFILING": False,
}


def envs(module):
    """vllm.envs: the real module reads dozens of variables lazily and imports torch
    helpers; the scheduling modules read the ENVS keys only. Others raise."""
    for k, v in ENVS.items():
        setattr(module, k, v)

    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise StandInCalled(f"vllm.envs.{name} is not stood in: add its default to ENVS")
    module.__getattr__ = getattr_
    sys.modules["vllm"].envs = module


# vllm.config ------------------------------------------------------------------------
def config(module):
    """vllm.config: the package builds pydantic configs over transformers; the loaded
    modules name `VllmConfig`, `SchedulerConfig`, `KVEventsConfig`, `KVTransferConfig`
    in annotations only (the harness passes vllm_core.VllmConfig, a plain object with
    the fields the scheduler reads)."""
    placeholder(module, "VllmConfig", "SchedulerConfig", "CacheConfig", "ModelConfig",
                 "SpeculativeConfig", "KVTransferConfig")
    module.get_current_vllm_config_or_none = lambda: None


def config_kv_events(module):
    """vllm.config.kv_events: a pydantic config; annotation only (no KV events)."""
    placeholder(module, "KVEventsConfig")
    sys.modules["vllm.config"].KVEventsConfig = module.KVEventsConfig


def config_ec_manager(module):
    """vllm.config.ec_manager_config: pydantic; `EncoderCacheManagerMetadata` is an
    annotation of the scheduler output (no encoder cache)."""
    placeholder(module, "EncoderCacheManagerMetadata")


class NoEncoderCacheManagerConfig:
    """`ECManagerConfig.get_encoder_cache_manager_obj()` returns None by default (no
    custom encoder cache manager), and the scheduler then uses vLLM's own."""

    def get_encoder_cache_manager_obj(self):
        return None


# compilation, metrics, spec decode, structured output, LoRA, pooling, multimodal ---
def cuda_graph(module):
    """vllm.compilation.cuda_graph: CUDA graph capture; `CUDAGraphStat` is an
    annotation of the model runner output."""
    placeholder(module, "CUDAGraphStat")


def metrics_perf(module):
    """vllm.v1.metrics.perf: Prometheus and pydantic; `ModelMetrics` is built only with
    MFU metrics enabled (log_stats False here), `PerfStats` is an annotation."""
    placeholder(module, "PerfStats")
    refuse(module, "ModelMetrics")


def spec_decode_metrics(module):
    """vllm.v1.spec_decode.metrics: Prometheus; no spec decode (annotation only)."""
    placeholder(module, "SpecDecodingStats")


def spec_decode_dynamic(module):
    """vllm.v1.spec_decode.dynamic.utils: read only with a speculative config."""
    refuse(module, "build_dynamic_sd_schedule_lookup")


def kv_connector_metrics(module):
    """vllm.distributed.kv_transfer.kv_connector.v1.metrics: Prometheus; the connector
    stats the scheduler aggregates are None for a connector that keeps none."""
    placeholder(module, "KVConnectorStats")


def structured_output(module):
    """vllm.v1.structured_output: grammar backends (xgrammar, outlines). No request has
    a grammar: `accept_tokens` answers True for a request without structured output,
    as the first line of vLLM's own does (structured_output/__init__.py line 535);
    anything else raises."""
    class StructuredOutputManager:
        def accept_tokens(self, request, new_token_ids):
            if not request.use_structured_output or not new_token_ids:
                return True
            raise StandInCalled("structured output is not supported by the harness")

        def __getattr__(self, name):
            raise StandInCalled(f"StructuredOutputManager.{name}: no structured output")
    module.StructuredOutputManager = StructuredOutputManager


def structured_output_request(module):
    """vllm.v1.structured_output.request: `from_sampling_params` is None for sampling
    params without structured outputs (as vLLM's own returns, request.py line 36)."""
    class StructuredOutputRequest:
        @staticmethod
        def from_sampling_params(sampling_params):
            if sampling_params is None or not sampling_params.structured_outputs:
                return None
            raise StandInCalled("structured outputs are not supported by the harness")
    module.StructuredOutputRequest = StructuredOutputRequest


def structured_output_utils(module):
    """vllm.v1.structured_output.utils: `strip_speculative_padding` is read for spec
    tokens only (none here)."""
    refuse(module, "strip_speculative_padding")


def lora_request(module):
    """vllm.lora.request: msgspec struct, annotation only (no LoRA)."""
    placeholder(module, "LoRARequest")


def pooling_params(module):
    """vllm.pooling_params: pydantic over ModelConfig; pooling requests are not used
    (every request has SamplingParams)."""
    placeholder(module, "PoolingParams")


def multimodal(module):
    """vllm.multimodal: the registry imports processors and PIL; text-only models read
    `MULTIMODAL_REGISTRY` only as a default argument."""
    placeholder(module, "MultiModalRegistry")
    module.MULTIMODAL_REGISTRY = module.MultiModalRegistry()


def multimodal_inputs(module):
    """vllm.multimodal.inputs: tensors of multimodal items; annotation only."""
    placeholder(module, "MultiModalFeatureSpec", "MultiModalKwargsItem")


def multimodal_budget(module):
    """vllm.multimodal.encoder_budget: built only for multimodal models."""
    refuse(module, "MultiModalBudget")


def kv_hints(module):
    """vllm.v1.kv_hints: annotation of `Request.kv_hints` (None here)."""
    placeholder(module, "KvHintsEnvelope", "KvHintAction")


def serial_utils(module):
    """vllm.v1.serial_utils: msgpack/torch serialisation for IPC; annotation only."""
    placeholder(module, "UtilityResult", "PydanticMsgspecMixin")


def torch_utils(module):
    """vllm.utils.torch_utils: torch helpers; `PIN_MEMORY` is a default argument,
    `get_dtype_size` is read only for layer page sizes (never by the scheduler)."""
    module.PIN_MEMORY = False
    refuse(module, "get_dtype_size", "make_ndarray_with_pad", "is_non_overlapping_and_dense")


def platforms(module):
    """vllm.platforms: detects CUDA/ROCm/CPU at import. The KV spec registry asks
    `current_platform.register_custom_kv_cache_specs`, which the base Platform
    (platforms/interface.py line 1140) and the CPU platform leave empty;
    AsyncScheduler asks `is_xpu()` (False: the XPU-only PP micro-batch switch)."""
    class Platform:
        @classmethod
        def register_custom_kv_cache_specs(cls, vllm_config):
            pass

        @classmethod
        def is_xpu(cls):
            return False  # AsyncScheduler asks; the platform modelled is a GPU, not XPU

        def __getattr__(self, name):
            raise StandInCalled(f"current_platform.{name} is stood in (no GPU platform)")
    module.current_platform = Platform()


def attention_backend(module):
    """vllm.v1.attention.backend: attention kernels; annotation only."""
    placeholder(module, "AttentionMetadata", "MultipleOf")


def v1_utils_prelude(module):
    """Globals for the parts of vllm/v1/utils.py kept (ConstantList and
    record_function_or_nullcontext run verbatim; the profiler scope is the null context
    as envs.VLLM_CUSTOM_SCOPES_FOR_PROFILING is False; `tensor_data` needs torch)."""
    from collections.abc import Callable, Sequence
    from typing import Generic, TypeVar, overload
    module.__dict__.update(
        contextlib=contextlib, Generic=Generic, TypeVar=TypeVar, overload=overload,
        Sequence=Sequence, Callable=Callable, T=TypeVar("T"), Any=Any,
        envs=sys.modules["vllm.envs"], _PROFILER_FUNC=None,
        AbstractContextManager=contextlib.AbstractContextManager)
    module.torch = sys.modules["torch"]
    module.record_function = contextlib.nullcontext  # torch's profiler scope
    refuse(module, "tensor_data")


# distributed: connectors and events -----------------------------------------------------
class ConnectorSlot:
    """What `KVConnectorFactory.create_connector` returns: vllm_core.build_scheduler
    puts the caller's scheduler-side connector here before constructing the
    Scheduler (an instance, or a class or function called as vLLM's factory calls a
    connector class: (vllm_config, role, kv_cache_config)). vLLM's factory resolves a
    class name from KVTransferConfig and imports every connector module."""

    connector: Any = None


def kv_connector_factory(module):
    """vllm.distributed.kv_transfer.kv_connector.factory: see ConnectorSlot."""
    class KVConnectorFactory:
        @staticmethod
        def create_connector(config, role, kv_cache_config=None):
            c = ConnectorSlot.connector
            if c is None:
                raise StandInCalled("no connector given to build_scheduler")
            is_instance = hasattr(c, "get_num_new_matched_tokens") and not isinstance(c, type)
            if not is_instance:
                return c(config, role, kv_cache_config)
            return c
    module.KVConnectorFactory = KVConnectorFactory


def kv_connector_v1(module):
    """vllm.distributed.kv_transfer.kv_connector.v1 (package init): re-exports vLLM's
    own base classes from base.py (verbatim); the init also imports a bench
    connector that needs torch."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import base
    for name in ("KVConnectorBase_V1", "KVConnectorRole", "SupportsHMA"):
        setattr(module, name, getattr(base, name))


def ec_connector_base(module):
    """vllm.distributed.ec_transfer: encoder-cache transfer, off (no EC config)."""
    placeholder(module, "ECConnectorBase", "ECConnectorMetadata")

    class ECConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1
    module.ECConnectorRole = ECConnectorRole


def ec_connector_factory(module):
    """vllm.distributed.ec_transfer.ec_connector.factory: off (no EC config)."""
    placeholder(module, "ECConnectorFactory")


def ec_connector_metrics(module):
    """vllm.distributed.ec_transfer.ec_connector.metrics: Prometheus; annotation."""
    placeholder(module, "ECConnectorStats")


def aux_output_connector(module):
    """vllm.distributed.aux_output_connector.connector: built only when
    aux_output_config.enabled (False)."""
    refuse(module, "AuxOutputSchedulerConnector")


def kv_events_prelude(module):
    """Globals for vllm/distributed/kv_events.py minus its ZeroMQ publisher: the event
    classes, NullEventPublisher and EventPublisherFactory run verbatim (the factory
    returns NullEventPublisher without a KV events config)."""
    module.zmq = None
    refuse(module, "ZmqEventPublisher")  # the factory's registry names it
    from vllm.config.kv_events import KVEventsConfig
    module.KVEventsConfig = KVEventsConfig


def utils_package_prelude(module):
    """Globals for `length_from_prompt_token_ids_or_embeds` of vllm/utils/__init__.py
    (the rest of that init imports torch and many helpers)."""
    module.torch = sys.modules["torch"]
    module.__path__ = []


def multimodal_utils_prelude(module):
    """Globals for `get_mm_features_in_window` and `strip_covered_mm_data` of
    vllm/multimodal/utils.py (the rest decodes media with PIL)."""
    import bisect
    from dataclasses import replace
    module.bisect = bisect
    module.replace = replace
    placeholder(module, "MultiModalFeatureSpec")


def outputs_prelude(module):
    """Globals for `RequestError` of vllm/outputs.py (the rest builds RequestOutputs
    over torch and logprobs); its exceptions come from vllm/exceptions.py, verbatim."""
    from vllm.exceptions import GenerationError, RetryableRequestError, VLLMValidationError
    module.__dict__.update(dataclass=dataclass, GenerationError=GenerationError,
                           RetryableRequestError=RetryableRequestError,
                           VLLMValidationError=VLLMValidationError)


def sampling_params(module):
    """vllm.sampling_params: `SamplingParams` is a msgspec struct validated by pydantic
    against ModelConfig and tokenizers. What the scheduling code reads of it
    (request.py, sched/utils.py check_stop, scheduler.py) is the fields below, with
    SamplingParams's defaults (sampling_params.py lines 330-430) and its
    `skip_reading_prefix_cache` rule (line 625: prompt logprobs only)."""

    @dataclass
    class SamplingParams:
        max_tokens: int | None = 16
        min_tokens: int = 0
        stop_token_ids: list[int] | None = None
        logprobs: int | None = None
        prompt_logprobs: int | None = None
        structured_outputs: Any = None
        extra_args: dict[str, Any] | None = None
        skip_reading_prefix_cache: bool | None = None
        repetition_detection: Any = None
        _eos_token_id: int | None = None
        _all_stop_token_ids: set[int] = field(default_factory=set)

        def __post_init__(self):
            self._all_stop_token_ids.update(self.stop_token_ids or ())
            if self.skip_reading_prefix_cache is None:
                self.skip_reading_prefix_cache = self.prompt_logprobs is not None

        @property
        def eos_token_id(self):
            return self._eos_token_id

        @property
        def all_stop_token_ids(self):
            return self._all_stop_token_ids

        @property
        def num_logprobs(self):
            return self.logprobs

    module.SamplingParams = SamplingParams
    placeholder(module, "RepetitionDetectionParams")

    class RequestOutputKind(enum.Enum):
        CUMULATIVE = 0
        DELTA = 1
        FINAL_ONLY = 2
    module.RequestOutputKind = RequestOutputKind


def hashing_prelude(module):
    """Globals for vllm/utils/hashing.py without cbor2 and xxhash: `sha256` (the
    default `prefix_caching_hash_algo`) runs verbatim; the others raise."""
    try:
        import cbor2
    except ImportError:
        cbor2 = None
    module.cbor2 = cbor2


def empty(module):
    """A package whose init is not needed and whose children load normally."""
    module.__path__ = []


__all__ = [n for n, v in dict(globals()).items()
           if isinstance(v, types.FunctionType) and not n.startswith("_")]
