"""One turn of vLLM 0.33.0's own engine loop, around vLLM's Scheduler, on CPU.

`EngineLoop(wheel, scheduler, model_runner)` runs the wheel's own
`EngineCore.step` (one batch: schedule, execute, update_from_output) or, when the
scheduler runs with `max_concurrent_batches` 2 (async scheduling),
`EngineCore.step_with_batch_queue` (batch k is scheduled, then batch k - 1's output
is processed), as EngineCore picks its `step_fn` (vllm/v1/engine/core.py line 232).
Both methods and the helpers they call (`_should_throttle_prefills`,
`_process_aborts_queue`, `log_error_detail`, `capture_iteration_details`,
`_attach_iteration_details`, `_attach_weight_version`) are taken from the wheel with
`ast` and run unchanged on this object, which holds the fields they read.

The model executor is a stand-in (no GPU): `execute_model` computes the model
runner's output for the SchedulerOutput at once (`model_runner(scheduler_output)`),
and returns it in a resolved Future, as `sample_tokens` does; `scheduled` lists the
SchedulerOutputs it received in this turn.
"""

import queue
import zipfile
from collections import deque
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from typing import Any, cast

from wheel_import import class_methods

CORE = "vllm/v1/engine/core.py"
METHODS = ["step", "step_with_batch_queue", "_should_throttle_prefills",
           "_process_aborts_queue", "log_error_detail", "capture_iteration_details",
           "_attach_iteration_details", "_attach_weight_version"]


class _Executor:
    """The model executor's calls in EngineCore.step and step_with_batch_queue."""

    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.scheduled = []
        self.last = None

    def execute_model(self, scheduler_output, non_block=False):
        self.scheduled.append(scheduler_output)
        self.last = self.model_runner(scheduler_output)
        return _done(self.last) if non_block else self.last

    def sample_tokens(self, grammar_output, non_block=False):
        return _done(self.last) if non_block else self.last


def _done(value):
    f = Future()
    f.set_result(value)
    return f


class EngineLoop:
    """What vLLM's EngineCore methods read of `self` (see the module docstring)."""

    def __init__(self, wheel, scheduler, model_runner):
        from vllm.v1.outputs import ModelRunnerOutput
        with zipfile.ZipFile(wheel) as z:
            self._methods = class_methods(z, CORE, "EngineCore", METHODS, {
                "Future": Future, "cast": cast, "contextmanager": contextmanager,
                "ExitStack": ExitStack, "Any": Any, "ModelRunnerOutput": ModelRunnerOutput,
                "dump_engine_exception": lambda *a, **k: None})
        self.scheduler = scheduler
        self.vllm_config = scheduler.vllm_config
        self.log_stats = False
        self.model_executor = _Executor(model_runner)
        self.is_mm_encoder_only = False
        self.is_pooling_model = False
        self.check_for_draft_tokens = False
        self.aborts_queue = queue.Queue()
        self._weight_version = "default"
        # EngineCore.__init__: batch_queue_size = max_concurrent_batches; a queue
        # only when it is over 1.
        self.batch_queue_size = self.vllm_config.max_concurrent_batches
        self.batch_queue = (deque(maxlen=self.batch_queue_size)
                            if self.batch_queue_size > 1 else None)

    def __getattr__(self, name):
        methods = self.__dict__.get("_methods", {})
        if name in methods:
            return methods[name].__get__(self)
        raise AttributeError(f"EngineLoop has no {name!r}: vLLM's engine loop reads it")

    def turn(self):
        """One `step_fn()` call: (engine outputs or None, model executed, the
        SchedulerOutputs scheduled in it)."""
        self.model_executor.scheduled = []
        step = self.step if self.batch_queue is None else self.step_with_batch_queue
        outputs, executed = step()
        return outputs, executed, list(self.model_executor.scheduled)
