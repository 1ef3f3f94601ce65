"""gluon_gpu.train with a pause inside every checkpoint write, after the parameters and
before the optimizer state, for the tests that kill or interrupt it there:
``python tests/paused_checkpoints.py SECONDS TRAIN-FLAGS...``."""
import sys
import time

from gluon_gpu.core.state import checkpoint
from gluon_gpu.programs.train import main

SECONDS = float(sys.argv[1])
write_optimizer_state = checkpoint.save_optimizer_state


def paused(*args, **kwargs):
    time.sleep(SECONDS)
    return write_optimizer_state(*args, **kwargs)


checkpoint.save_optimizer_state = paused
sys.exit(main(sys.argv[2:]))
