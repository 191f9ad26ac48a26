"""vLLM 0.33's Mooncake store ``LookupKeyClient``, backed by the Rust ``LookupClient``.

``LookupKeyClient(vllm_config)`` takes vLLM's config and answers as vLLM's class of
the same name does (``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/
worker.py``): ``lookup(req_id, num_tokens, block_hashes, non_block=False)`` (``None``
until ready when ``non_block``), ``discard(req_id)``, ``reset() -> bool``,
``close()``. What changes: every lookup has a timeout (``lookup_timeout_s``, 5 s by
default) and answers 0 with ``answer_of(req_id).kind == "unavailable"`` instead of
blocking forever; ``prefetch`` starts a lookup at arrival; the I/O runs on a Rust
runtime thread and blocking waits release the GIL, so no Python thread is added.

The transport comes from ``kv_connector_extra_config``:

- default: vLLM's own ZeroMQ server on worker rank 0, at the ipc path vLLM derives
  (``VLLM_RPC_BASE_PATH``, ``lookup_rpc_port``, the hostname, ``data_parallel_index``);
- ``lookup_endpoint``: another ZeroMQ URL (``tcp://HOST:PORT``, ``ipc://PATH``), for
  example a ``lookup-server``;
- ``lookup_mooncake_master``: ask the Mooncake master directly, ``host:port`` or
  ``etcd://h1:p1;h2:p2``, with keys of the model ``lookup_model`` (default: the last
  path component of ``model_config.model``, as vLLM's worker keys them).
"""

import functools
import json
import logging
import os
import socket
import tempfile
from dataclasses import dataclass
from typing import NamedTuple

from ._native import NativeClient, extra_config_keys

__all__ = [
    "Answer", "LookupKeyClient", "LookupResult", "TailKeyBoundary", "endpoint_of",
    "tail_key_boundaries",
]

# The keys this package reads beyond the Rust client's (which ignores them).
TRANSPORT_KEYS = ("lookup_endpoint", "lookup_mooncake_master", "lookup_model")


@dataclass(frozen=True)
class TailKeyBoundary:
    """vLLM's ``TailKeyBoundary``: the token boundary ``num_tokens`` whose prefix hash
    keys KV-cache group ``group_id``'s tail block in the store."""

    group_id: int
    num_tokens: int


@dataclass
class LookupResult:
    """vLLM's ``MooncakeLookupResult``: ``hit_length`` tokens stored, and the tail-key
    boundaries (``tail_key_boundaries``)."""

    hit_length: int
    tail_key_boundaries: tuple = ()


def tail_key_boundaries(hit_length, group_ids=(0,), boundary_type=TailKeyBoundary):
    """The tail-key boundaries vLLM 0.33's worker answers with a hit of ``hit_length``
    tokens (``MooncakeStoreWorker._tail_key_boundaries``): none for 0, else one per
    prefix-cacheable KV-cache group in ``group_ids``, each at ``hit_length`` (a hit of
    whole blocks, without partial hash hits, ends on every group's stored key).

    The Rust client reads a reply's hit length only, so the drop-in answers these for
    every transport: on vLLM's own worker they are the bytes its server sends."""
    if hit_length <= 0:
        return ()
    return tuple(boundary_type(g, hit_length) for g in group_ids)


class Answer(NamedTuple):
    """What a request's last answer rested on (``answer_of``): ``kind`` is ``"hit"``,
    ``"miss"``, ``"not_needed"`` or ``"unavailable"``; ``hit_tokens`` the tokens stored
    for a hit (else 0); ``reason`` why the store was unavailable (``"timed_out"``,
    ``"transport"``, ``"not_sent"``, ``"malformed"``, ``"store"`` (the lookup server
    could not ask its store: spec/wire.md, "Store unavailable"), ``"retrying"``,
    ``"closed"``)."""

    kind: str
    hit_tokens: int
    reason: str | None


def _result_types():
    """vLLM's own result and boundary classes when vLLM is importable, else
    ``LookupResult`` and ``TailKeyBoundary``."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (
            MooncakeLookupResult,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (
            TailKeyBoundary as VllmTailKeyBoundary,
        )

        return MooncakeLookupResult, VllmTailKeyBoundary
    except Exception:  # noqa: BLE001 - no vLLM (or no torch): same fields, our classes
        return LookupResult, TailKeyBoundary


def _build_result(result_type, boundary_type, group_ids, hit):
    """``result_type(hit, its tail-key boundaries)``."""
    return result_type(hit, tail_key_boundaries(hit, group_ids, boundary_type))


def endpoint_of(vllm_config) -> str:
    """The ipc URL of vLLM's ``get_zmq_rpc_path_lookup``: ``VLLM_RPC_BASE_PATH`` (the
    temp dir by default), ``lookup_rpc_port``, the hostname and the data-parallel
    index."""
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
    base = os.environ.get("VLLM_RPC_BASE_PATH", tempfile.gettempdir())
    rpc_port = extra.get("lookup_rpc_port", 0)
    dp_rank = vllm_config.parallel_config.data_parallel_index
    host = socket.gethostname()
    return f"ipc://{base}/lookup_rpc_port_{rpc_port}_host_{host}_dp_rank{dp_rank}"


_logger = logging.getLogger(__name__)


def _warn_unknown_lookup_keys(extra):
    """Logs a warning naming each ``lookup_*`` key of ``kv_connector_extra_config``
    that neither this package nor vLLM reads: the dict is read leniently (vLLM's own
    keys share it), so a mistyped key would otherwise keep its default unnoticed."""
    known = set(extra_config_keys()) | set(TRANSPORT_KEYS)
    unknown = sorted(k for k in extra if str(k).startswith("lookup_") and k not in known)
    if unknown:
        _logger.warning(
            "kv_connector_extra_config: unknown key(s) %s ignored (the lookup keys are: %s)",
            ", ".join(unknown), ", ".join(sorted(k for k in known if k.startswith("lookup_"))))


class LookupKeyClient:
    """Drop-in for vLLM 0.33's ``LookupKeyClient`` (module docstring). Raises
    ``ValueError`` for a bad ``kv_connector_extra_config`` key or address.

    ``tail_key_groups``: the store's KV-cache group ids a result's
    ``tail_key_boundaries`` name (``(0,)``: one full-attention group; the connector
    of ``mooncake_lookup.vllm`` sets it from the engine's KV-cache config)."""

    def __init__(self, vllm_config, extra_config=None):
        """``extra_config``: used instead of the config's ``kv_connector_extra_config``
        when given (the connector adds its prefetch defaults this way)."""
        if extra_config is None:
            extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
        extra = dict(extra_config or {})
        block_size = int(vllm_config.cache_config.block_size)
        master = extra.get("lookup_mooncake_master")
        if master:
            transport, target = "direct", str(master)
        else:
            transport, target = "zmq", str(extra.get("lookup_endpoint") or endpoint_of(vllm_config))
        model = extra.get("lookup_model")
        if model is None:
            model_config = getattr(vllm_config, "model_config", None)
            model = str(getattr(model_config, "model", "model")).rstrip("/").split("/")[-1]
        rust_keys = {k: v for k, v in extra.items() if k not in TRANSPORT_KEYS}
        _warn_unknown_lookup_keys(extra)
        self.endpoint = target
        self._result, self._boundary = _result_types()
        self._tail_key_groups = (0,)
        self._native = NativeClient(transport, target, block_size, json.dumps(rust_keys), model)
        self._set_factory()
        # The native calls themselves, no Python frame between: a scheduler step's
        # polls, arrivals, allocations and finishes cost the client's work alone. The
        # methods of the same names below are their documentation.
        native = self._native
        self.lookup = native.lookup
        self.prefetch = native.prefetch
        self.flush = native.flush
        self.discard = native.discard
        self.on_allocated = native.on_allocated
        self.on_preempted = native.on_preempted

    def _set_factory(self):
        # A partial, not a bound method: the native client holding `self` would be a
        # cycle the garbage collector cannot see through.
        self._native.set_result_factory(functools.partial(
            _build_result, self._result, self._boundary, self._tail_key_groups))

    def lookup(self, req_id, num_tokens, block_hashes, non_block=False):
        """The request's result, or ``None`` while pending when ``non_block``; the first
        call starts the lookup, the answering call consumes it (as vLLM's). ``req_id``
        a ``str``, ``num_tokens`` an ``int``, ``block_hashes`` a sequence of ``bytes``
        (vLLM's types; others raise ``TypeError``). Results are shared by requests with
        the same answer (vLLM's scheduler only reads them). Replaced per instance by
        the native method itself (``__init__``); this is its documentation."""
        return self._native.lookup(req_id, num_tokens, block_hashes, non_block)

    @property
    def tail_key_groups(self):
        """The KV-cache group ids a result's tail-key boundaries name (class doc)."""
        return self._tail_key_groups

    @tail_key_groups.setter
    def tail_key_groups(self, groups):
        self._tail_key_groups = tuple(groups)
        self._set_factory()

    def prefetch(self, req_id, num_tokens, block_hashes):
        """Start ``req_id``'s lookup now (at arrival), read later with ``lookup``. Sent
        only while ``lookup_prefetch_limit`` allows (0 by default: announce only), at
        this client's next call of any kind (``flush`` sends it at once): the arrivals
        before a scheduler step wake the I/O thread once. ``req_id`` a ``str`` (other
        objects are read as their ``str()``), ``num_tokens`` an ``int``. Under
        ``defer_sends`` the arrival is only recorded (its id and hashes copied), and
        the next call of another kind applies the arrivals together. Replaced per
        instance by the native method itself (``__init__``)."""
        self._native.prefetch(req_id, num_tokens, block_hashes)

    def flush(self):
        """Send the prefetches not sent yet (the connector calls it once per step).
        Replaced per instance by the native method itself."""
        self._native.flush()

    def defer_sends(self, on=True):
        """``on``: a non-blocking ``lookup`` leaves any new RPC (a lookup it starts, the
        step's prefetches) for the next ``flush`` (or any call other than a
        non-blocking ``lookup`` or ``prefetch``) instead of waking the I/O thread
        itself: a scheduler step, which polls each waiting request once, then wakes it
        once. A request polled twice before the next ``flush`` hands over at its second
        poll, so a caller polling in a loop is answered one poll later, not never. For
        a caller that calls ``flush`` once per step, as the connector of
        ``mooncake_lookup.vllm`` does in ``build_connector_meta``; off by default
        (vLLM's scheduler with this client alone never calls ``flush``, and a step's
        last lookups would wait for the next step)."""
        self._native.set_defer_sends(bool(on))

    def answer_of(self, req_id):
        """``Answer`` of ``req_id``'s last lookup, or ``None``: tells a miss from an
        unavailable store, which both answer 0. Kept until ``discard`` (vLLM's
        scheduler discards at finish); without one, only the newest 65,536 answers
        are kept at most (then the older half goes), so a caller that never discards
        does not grow the client without bound."""
        got = self._native.answer_of(req_id)
        return None if got is None else Answer(*got)

    def discard(self, req_id):
        """Drop any queued, in-flight or answered lookup of ``req_id`` (a ``str``, or
        read as its ``str()``). Replaced per instance by the native method itself."""
        self._native.discard(req_id)

    def on_allocated(self, req_id):
        """``req_id`` got its blocks: a lookup still held (a prefetch never read) is
        dropped (rule 8). Replaced per instance by the native method itself."""
        self._native.on_allocated(req_id)

    def on_preempted(self, req_id):
        """``req_id`` was preempted: its lookup and last answer are dropped; it is
        looked up again when rescheduled (rule 8). Replaced per instance by the native
        method itself."""
        self._native.on_preempted(req_id)

    def tracked_requests(self):
        """Requests with a lookup held (announced, not yet answered or dropped)."""
        return self._native.tracked_requests()

    def reset(self):
        """Wipe the store through the server; True on its acknowledgement, False on a
        refusal or no answer within the timeout."""
        return self._native.reset()

    def close(self):
        """Stop the I/O; later lookups answer 0 at once."""
        self._native.close()

    def stats(self):
        """The Rust client's counters (``rpcs_sent``, ``late_replies``, ...)."""
        return self._native.stats()
