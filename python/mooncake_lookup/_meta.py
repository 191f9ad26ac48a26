"""What ``mooncake_lookup.vllm``'s connector changes around vLLM 0.33's
``MooncakeStoreScheduler.build_connector_meta`` so that a step's metadata costs the
step's admissions and loads, not the running batch twice over, with the same metadata
as vLLM's own connector builds (``python/tests/test_vllm_scheduler.py`` compares them
step by step).

vLLM's build makes two passes whose cost is the batch's, not the step's:

- it asks, for each of its unfinished requests, whether it is in the step's list of
  running ids (``scheduled_cached_reqs.req_ids``): a list scan each, running x running
  string compares per step. ``running_ids_as_dict`` hands it the same ids as a dict
  for the call: the same iteration order and membership answers, one hash each;
- its last pass walks every unfinished request to issue the loads of those not
  scheduled this step, and does nothing for a request without a load spec (it pops
  ``load_specs`` and moves on). ``UnfinishedRequests`` is vLLM's own dict of unfinished
  requests, with ``items()`` narrowed, only while the connector's build runs, to the
  requests that have a load spec, in the dict's order: the pass's Python body runs for
  those alone, and the others cost one membership test each inside a comprehension.
"""

from contextlib import contextmanager

__all__ = ["UnfinishedRequests", "running_ids_as_dict", "DICT_FROM"]

# Running requests from which the running ids go to vLLM's build as a dict (below it
# the list's scan is as cheap as the dict's build).
DICT_FROM = 16


@contextmanager
def running_ids_as_dict(scheduler_output):
    """For the ``with`` body, ``scheduler_output.scheduled_cached_reqs.req_ids`` is a
    dict of the same ids in the same order (from ``DICT_FROM`` running requests, and
    only when no id repeats: vLLM indexes its other per-request lists by the position
    in this one); the list is put back on exit, whatever happens in the body."""
    cached = scheduler_output.scheduled_cached_reqs
    req_ids = cached.req_ids
    as_dict = dict.fromkeys(req_ids) if len(req_ids) >= DICT_FROM else None
    if as_dict is None or len(as_dict) != len(req_ids):
        yield
        return
    cached.req_ids = as_dict
    try:
        yield
    finally:
        cached.req_ids = req_ids


class UnfinishedRequests(dict):
    """vLLM's ``MooncakeStoreScheduler._unfinished_requests`` (request id ->
    (request, block ids)), put in place by ``install``. Every dict operation is the
    dict's own; ``items()`` gives, while ``narrowed`` is set, only the entries whose id
    is in the scheduler's ``load_specs``, in the dict's order (a list made when called;
    vLLM's pass pops ``load_specs`` as it goes and does not touch this dict)."""

    __slots__ = ("_scheduler", "narrowed")

    def __init__(self, entries, scheduler):
        super().__init__(entries)
        self._scheduler = scheduler
        self.narrowed = False

    @classmethod
    def install(cls, scheduler):
        """Replaces ``scheduler._unfinished_requests`` (its entries kept) and returns
        the new dict."""
        unfinished = cls(scheduler._unfinished_requests, scheduler)
        scheduler._unfinished_requests = unfinished
        return unfinished

    def items(self):
        if not self.narrowed:
            return super().items()
        load_specs = self._scheduler.load_specs
        if not load_specs:
            return []
        return [(k, v) for k, v in super().items() if k in load_specs]

    @contextmanager
    def narrowed_to_loads(self):
        """``items()`` narrowed for the ``with`` body."""
        self.narrowed = True
        try:
            yield
        finally:
            self.narrowed = False
