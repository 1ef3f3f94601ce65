"""--profile N: MXNet's profiler over N training steps after a warm-up, written as a
Chrome trace (``RUN/profile.json``, open it in chrome://tracing or Perfetto) and
MXNet's per-operator table (``RUN/profile.txt``). The profiler works in the CPU wheel
although ``mx.runtime.Features()`` reports PROFILER off."""
import os

import mxnet as mx

from ..platform.files import atomic_write, write_text
from .callbacks import Callback

WARMUP_STEPS = 10  # graphs built, memory planned, caches warm: steps like the rest


class StepProfiler(Callback):
    """Callback with ``on_step``: profiles steps WARMUP_STEPS + 1 .. WARMUP_STEPS + N of
    this process, then writes both files; ``on_train_end`` writes what it has if the run
    ended sooner."""

    def __init__(self, run_dir, steps, warmup=WARMUP_STEPS):
        self.trace, self.table = os.path.join(run_dir, "profile.json"), os.path.join(run_dir, "profile.txt")
        self.steps, self.warmup = steps, warmup
        self.seen, self.profiled, self.running = 0, 0, False
        self._tmp = os.path.join(run_dir, ".profile.json.tmp")

    def on_step(self, epoch, batch):  # pylint: disable=unused-argument
        self.seen += 1
        if self.seen == self.warmup:
            mx.nd.waitall()  # the warm-up's queued work stays out of the trace
            # Everything but memory: MXNet 1.9's storage profiler keeps a counter for cpu(0)
            # only, and an allocation on cpu(1) while it runs aborts the step ("Invalid
            # device index: 1", seen once in CI on cpu*2).
            mx.profiler.set_config(profile_symbolic=True, profile_imperative=True, profile_api=True,
                                   profile_memory=False, aggregate_stats=True, filename=self._tmp)
            mx.profiler.set_state("run")
            self.running = True
        elif self.running:
            self.profiled += 1
            if self.profiled == self.steps:
                self._finish()

    def _finish(self):
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        self.running = False
        mx.profiler.dump()
        atomic_write(self.trace, lambda tmp: os.replace(self._tmp, tmp))
        write_text(self.table, f"{self.profiled} steps after {self.warmup} of warm-up\n"
                   + mx.profiler.dumps(reset=True))

    def on_epoch_end(self, record, history):
        pass

    def on_train_end(self, history, status, reason=None):
        if self.running:
            self._finish()

    def describe(self):
        """What the run's end line says of the profile."""
        if self.profiled == 0:
            return f"no profile: the run had fewer than {self.warmup + 1} steps"
        return f"profile of {self.profiled} steps in {self.trace} and {self.table}"
