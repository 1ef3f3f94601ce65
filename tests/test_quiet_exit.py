"""No program prints a traceback at exit after a signal (issue #54): once its main is
done, a second stop signal (scancel signals a step's processes again) is ignored, and
what MXNet's arrays raise as they are freed in the interpreter's teardown is unsaid."""
import subprocess
import sys

from test_checkpoints import REPO

PROBE = """
import os, signal
import mxnet as mx
from gluon_gpu.core.platform import signals
signals.raise_on_stop_signals()
signals.ignore_at_exit()
os.kill(os.getpid(), signal.SIGTERM)  # ignored now: the program goes on to its end

def stop(self):
    raise signals.Stopped(signal.SIGTERM)
stop.__module__ = "mxnet.ndarray.ndarray"  # as an MXNet array's __del__ stopped by a signal
def mine(self):
    raise ValueError("mine")
Array, Other = type("Array", (), {"__del__": stop}), type("Other", (), {"__del__": mine})
Array()  # unsaid
Other()  # anything else: said, as Python says it
arrays = [mx.nd.ones((64, 64)) for _ in range(100)]  # freed in the teardown
print("ended")
"""


def test_a_stop_signal_after_main_and_arrays_freed_at_exit_print_no_traceback():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ended", done.stderr
    assert "Stopped" not in done.stderr and "ValueError: mine" in done.stderr


FORKED = """
import multiprocessing, signal, threading
from gluon_gpu.core.platform import signals
signals.raise_on_stop_signals()

def worker(ready):
    # a DataLoader worker stuck at its start: its main thread blocked in a lock, another
    # thread running, so a Python handler would never run
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.getsignal(signal.SIGHUP) is signal.SIG_DFL,
          flush=True)
    ready.set()
    lock = multiprocessing.Lock()
    lock.acquire()
    lock.acquire()  # forever

ready = multiprocessing.get_context("fork").Event()
child = multiprocessing.get_context("fork").Process(target=worker, args=(ready,))
child.start()
ready.wait(60)
child.terminate()  # what a pool's terminate() sends
child.join(60)
print(child.exitcode, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def test_a_forked_worker_ends_on_sigterm_even_with_its_main_thread_blocked():
    """A forked child (DataLoader, pack worker) takes the stop signals' defaults at the
    fork, so a pool's terminate() ends it wherever its threads are; the parent keeps
    its handler."""
    done = subprocess.run([sys.executable, "-c", FORKED], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "-15", "False"], done.stdout + done.stderr
