"""The programs' entry (``python -m gluon_gpu.<program>``, ``gluon-gpu-<program>``):
the environment variables MXNet reads at start are checked before MXNet is imported
(on a bad one MXNet aborts, crashes or hangs: core/platform/environment.py), its OpenMP threads
are fitted to a CPU quota, and a Ctrl-C while it is imported is one line, as later."""
import importlib
import sys

from .core.platform import environment, pools, signals  # import no MXNet


def program(name, path=None):
    """The ``main(argv=None) -> exit status`` of ``programs/<path>.py`` (default:
    ``name``), imported on its first call."""
    def main(argv=None):
        signals.raise_on_stop_signals()
        found = environment.problem()
        if found:
            print(f"gluon_gpu: error: {found}", file=sys.stderr)
            return 2
        environment.fit_threads_to_cpu_quota()
        pools.sweep_temp_dirs()  # the temporaries of a program killed before it could
        try:
            module = importlib.import_module(f"{__package__}.programs.{path or name}")
        except KeyboardInterrupt:
            print(f"gluon_gpu.{name}: interrupted", file=sys.stderr)
            return 130
        except signals.Stopped as e:
            print(f"gluon_gpu.{name}: stopped by {e}", file=sys.stderr)
            return 128 + e.signum
        try:
            return module.main(argv)
        finally:
            signals.ignore_at_exit()
    main.__name__ = main.__qualname__ = f"{name}_main"
    return main
