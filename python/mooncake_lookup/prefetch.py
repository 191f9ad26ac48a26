"""Arrival-time prefetch for vLLM 0.33's ``MooncakeStoreScheduler``, with no vLLM import.

``SchedulerPrefetch(scheduler, vllm_config, kv_cache_config)`` puts the drop-in
``LookupKeyClient`` in place of the scheduler's own client (its
``get_num_new_matched_tokens``, ``build_connector_meta`` and ``reset_store`` run
unchanged and call the drop-in), and gives the connector the calls vLLM's scheduler
makes at the points the prefetch design names (``spec/behaviour.md`` rules 1-3, 8):

- ``on_new_request``: an eligible request's lookup starts at arrival (rule 1: lookups
  on, at least one block of ``num_tokens``, a block hash, not
  ``skip_reading_prefix_cache``), within ``lookup_prefetch_limit`` lookups in flight;
  its result stays valid ``lookup_prefetch_ttl_s`` (rules 2, 6);
- ``on_allocated`` (after ``update_state_after_alloc``), ``on_finished``
  (``request_finished``), ``on_preempted`` (the step's ``preempted_req_ids``, before
  ``build_connector_meta``), reset (vLLM's ``reset_store`` calls the drop-in's
  ``reset``, which drops every lookup) and ``close``: the lookup is dropped (rule 8).

``mooncake_lookup.vllm`` wires it into a connector vLLM loads with
``kv_connector_module_path``; tests drive it against vLLM's own scheduler class.
"""

from . import LookupKeyClient

__all__ = [
    "DEFAULT_PREFETCH_LIMIT", "DEFAULT_PREFETCH_TTL_S", "PREEMPTION_POLICIES",
    "SchedulerPrefetch", "prefetch_extra_config",
]

# Arrival-time lookups in flight at most, when `lookup_prefetch_limit` is not given
# (vLLM's key; 0 turns prefetch off).
DEFAULT_PREFETCH_LIMIT = 16
# Seconds a completed result stays valid, when `lookup_prefetch_ttl_s` is not given
# (the spec's default).
DEFAULT_PREFETCH_TTL_S = 2.0
# The values of `lookup_on_preemption` (`spec/behaviour.md` rule 8); the drop-in reads
# its requests' answers once (vLLM's `lookup` pops them), so only `discard` (vLLM's)
# applies to it.
PREEMPTION_POLICIES = ("discard", "keep", "wait", "keep_wait")


def prefetch_extra_config(extra):
    """``kv_connector_extra_config`` with the prefetch defaults where a key is absent:
    ``lookup_prefetch_limit`` ``DEFAULT_PREFETCH_LIMIT``, ``lookup_prefetch_ttl_s``
    ``DEFAULT_PREFETCH_TTL_S``. Raises ``ValueError`` for a ``lookup_on_preemption``
    the drop-in cannot follow."""
    out = dict(extra or {})
    out.setdefault("lookup_prefetch_limit", DEFAULT_PREFETCH_LIMIT)
    out.setdefault("lookup_prefetch_ttl_s", DEFAULT_PREFETCH_TTL_S)
    policy = out.pop("lookup_on_preemption", "discard")
    if policy not in PREEMPTION_POLICIES:
        raise ValueError(
            f"lookup_on_preemption: {policy!r} is not one of {', '.join(PREEMPTION_POLICIES)}")
    if policy != "discard":
        raise ValueError(
            f"lookup_on_preemption: {policy!r} keeps or waits for a preempted request's "
            "lookup, which the drop-in does not hold past its answer; use 'discard'")
    # Stated, not left to the core's default, so the drop-in never follows another.
    out["lookup_on_preemption"] = "discard"
    return out


class SchedulerPrefetch:
    """The drop-in on a ``MooncakeStoreScheduler`` (module docstring). ``client`` is
    the drop-in; vLLM's own client, made by the scheduler's constructor, is closed.
    Raises ``ValueError`` for a bad ``kv_connector_extra_config``."""

    def __init__(self, scheduler, vllm_config, kv_cache_config=None):
        extra = prefetch_extra_config(vllm_config.kv_transfer_config.kv_connector_extra_config)
        client = LookupKeyClient(vllm_config, extra)
        # vLLM's worker names one tail-key boundary per store group (the
        # prefix-cacheable groups, numbered from 0).
        groups = getattr(kv_cache_config, "prefix_cacheable_group_ids", None)
        if groups:
            client.tail_key_groups = tuple(range(len(groups)))
        # The step's first lookups of requests not prefetched go out with its
        # prefetches, at `on_step`'s flush: one wake-up of the I/O thread per step.
        client.defer_sends(True)
        theirs, scheduler.client = scheduler.client, client
        theirs.close()
        self.scheduler = scheduler
        self.client = client
        # Rule 1's settings, fixed at the scheduler's construction, read once here
        # rather than at each arrival.
        self._lookups_on = bool(scheduler.enable_lookup)
        self._align = (scheduler._hash_block_size if scheduler.enable_partial_hash_hits
                       else scheduler._block_size)
        self._prefetch = client.prefetch

    def eligible(self, request):
        """Rule 1, with the scheduler's own alignment (a block, or a hash block with
        partial hash hits): the probe would ask the store for it."""
        if not self._lookups_on or getattr(request, "skip_reading_prefix_cache", False):
            return False
        return request.num_tokens >= self._align and len(request.block_hashes) > 0

    def on_new_request(self, request):
        """vLLM's ``on_new_request``: starts the lookup of an eligible request
        (``eligible``)."""
        if self.eligible(request):
            self._prefetch(request.request_id, request.num_tokens, request.block_hashes)

    def on_allocated(self, request):
        """After ``update_state_after_alloc``: a lookup still held is dropped."""
        self.client.on_allocated(request.request_id)

    def on_finished(self, request):
        """vLLM's ``request_finished``: dropped now, not at the next step (rule 8)."""
        self.client.discard(request.request_id)

    def on_step(self, scheduler_output):
        """Before ``build_connector_meta``: drops the lookups of the step's preempted
        requests (``discard``) and sends the step's prefetches not sent yet."""
        preempted = scheduler_output.preempted_req_ids
        if preempted:
            on_preempted = self.client.on_preempted
            for req_id in preempted:
                on_preempted(req_id)
        # The step's arrivals and first lookups go now, together.
        self.client.flush()

    def close(self):
        """Stops the drop-in's I/O (idempotent)."""
        self.client.close()
