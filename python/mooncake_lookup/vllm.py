"""``MooncakeStoreConnector`` with the Rust lookup client and arrival-time prefetch.

Loaded by vLLM 0.33 with::

    --kv-transfer-config '{"kv_connector": "MooncakeLookupConnector",
      "kv_connector_module_path": "mooncake_lookup.vllm", "kv_role": "kv_both",
      "kv_connector_extra_config": {"lookup_async": true, "lookup_timeout_s": 5.0}}'

It is vLLM's own ``MooncakeStoreConnector`` (worker side, store layout, loads, saves,
metrics: all vLLM's); on the scheduler side its ``MooncakeStoreScheduler`` asks the
drop-in ``mooncake_lookup.LookupKeyClient`` instead of vLLM's client, and
``SchedulerPrefetch`` starts each eligible lookup at arrival (``on_new_request``) and
drops it on allocation, finish, preemption, reset and close (``mooncake_lookup.prefetch``).

Importing this module imports vLLM (and torch).
"""

from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import (
    MooncakeStoreConnector,
)

from .prefetch import SchedulerPrefetch

__all__ = ["MooncakeLookupConnector"]

# Running requests from which `build_connector_meta` hands vLLM's its running ids as a
# dict (below it the list's scan is as cheap as the dict's build).
_DICT_FROM = 16


class MooncakeLookupConnector(MooncakeStoreConnector):
    """vLLM's ``MooncakeStoreConnector`` whose scheduler side uses the drop-in client
    with prefetch. Same constructor; ``kv_connector_extra_config`` also takes the
    drop-in's keys (``lookup_timeout_s``, ``lookup_prefetch_limit``,
    ``lookup_prefetch_ttl_s``, ``lookup_endpoint``, ``lookup_mooncake_master``, ...).
    Raises ``ValueError`` for a known key with a bad value; unknown keys are ignored
    (the dict also holds vLLM's own)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.lookup_prefetch = None
        if self.connector_scheduler is not None:
            self.lookup_prefetch = SchedulerPrefetch(
                self.connector_scheduler, vllm_config, kv_cache_config)

    def on_new_request(self, request):
        super().on_new_request(request)
        if self.lookup_prefetch is not None:
            self.lookup_prefetch.on_new_request(request)

    # The hooks below call the drop-in's native methods directly (the bodies of
    # SchedulerPrefetch.on_allocated and on_finished, written out): they run once per
    # admission and finish on the scheduler's thread.

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        out = super().update_state_after_alloc(request, blocks, num_external_tokens)
        self.lookup_prefetch.client.on_allocated(request.request_id)
        return out

    def build_connector_meta(self, scheduler_output):
        self.lookup_prefetch.on_step(scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        req_ids = cached.req_ids
        if len(req_ids) < _DICT_FROM:
            return super().build_connector_meta(scheduler_output)
        # vLLM 0.33's MooncakeStoreScheduler.build_connector_meta asks, for each of its
        # unfinished requests, whether it is in this list: a scan each, so a step paid
        # running x running string compares. For the call the list is a dict of the
        # same ids in the same order: the same iteration and membership answers at one
        # hash each. The list is put back before the output goes on to the workers.
        cached.req_ids = dict.fromkeys(req_ids)
        try:
            return super().build_connector_meta(scheduler_output)
        finally:
            cached.req_ids = req_ids

    def request_finished_all_groups(self, request, block_ids):
        if self.lookup_prefetch is not None:
            self.lookup_prefetch.client.discard(request.request_id)
        return super().request_finished_all_groups(request, block_ids)

    def shutdown(self):
        prefetch = getattr(self, "lookup_prefetch", None)
        if prefetch is not None:
            prefetch.close()
        super().shutdown()
