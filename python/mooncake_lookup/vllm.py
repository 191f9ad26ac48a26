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
Around vLLM's ``build_connector_meta`` it makes the build's two passes over the
running batch cost the step's admissions and loads instead (``mooncake_lookup._meta``),
with the same metadata.

Importing this module imports vLLM (and torch).
"""

from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import (
    MooncakeStoreConnector,
)

from ._meta import UnfinishedRequests, running_ids_as_dict
from .prefetch import SchedulerPrefetch

__all__ = ["MooncakeLookupConnector"]


class MooncakeLookupConnector(MooncakeStoreConnector):
    """vLLM's ``MooncakeStoreConnector`` whose scheduler side uses the drop-in client
    with prefetch. Same constructor; ``kv_connector_extra_config`` also takes the
    drop-in's keys (``lookup_timeout_s``, ``lookup_prefetch_limit``,
    ``lookup_prefetch_ttl_s``, ``lookup_endpoint``, ``lookup_mooncake_master``, ...).
    Raises ``ValueError`` for a known key with a bad value; unknown keys are ignored
    (the dict also holds vLLM's own), an unknown ``lookup_*`` key with a warning
    naming it."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.lookup_prefetch = None
        self._unfinished = None
        if self.connector_scheduler is not None:
            self.lookup_prefetch = SchedulerPrefetch(
                self.connector_scheduler, vllm_config, kv_cache_config)
            self._unfinished = UnfinishedRequests.install(self.connector_scheduler)

    def on_new_request(self, request):
        super().on_new_request(request)
        if self.lookup_prefetch is not None:
            self.lookup_prefetch.on_new_request(request)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        out = super().update_state_after_alloc(request, blocks, num_external_tokens)
        self.lookup_prefetch.on_allocated(request)
        return out

    def build_connector_meta(self, scheduler_output):
        self.lookup_prefetch.on_step(scheduler_output)
        # vLLM's build, with its two batch-sized passes made step-sized
        # (mooncake_lookup._meta): the same metadata.
        with running_ids_as_dict(scheduler_output), self._unfinished.narrowed_to_loads():
            return super().build_connector_meta(scheduler_output)

    def request_finished_all_groups(self, request, block_ids):
        if self.lookup_prefetch is not None:
            self.lookup_prefetch.on_finished(request)
        return super().request_finished_all_groups(request, block_ids)

    def shutdown(self):
        prefetch = getattr(self, "lookup_prefetch", None)
        if prefetch is not None:
            prefetch.close()
        super().shutdown()
