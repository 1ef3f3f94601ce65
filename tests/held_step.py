"""gluon_gpu.train held after one given step, for the tests that stop it mid-epoch:
``python tests/held_step.py STEP MARKER TRAIN-FLAGS...`` trains, and after its STEP-th
step (counted from 1 over the whole run) creates the file MARKER and waits until the
test removes it, having sent its signal meanwhile: the stop lands after that step
whatever the machine's speed."""
import os
import sys
import time

from gluon_gpu.core.step.placed import PlacedStep
from gluon_gpu.core.step.replicated import ReplicatedStep
from gluon_gpu.programs.train import main

STEP, MARKER = int(sys.argv[1]), sys.argv[2]
STEPS = {kind: kind.step for kind in (ReplicatedStep, PlacedStep)}  # the two strategies (core/step/parallel.py)
steps = 0


def held(self, *args, **kwargs):
    global steps  # pylint: disable=global-statement
    result = STEPS[type(self)](self, *args, **kwargs)
    steps += 1
    if steps == STEP:
        with open(MARKER, "w"):
            pass
        while os.path.exists(MARKER):  # the test's signal is handled meanwhile
            time.sleep(0.01)
    return result


ReplicatedStep.step = PlacedStep.step = held
del sys.argv[1:3]  # the rest is train's command line, parsed as the CLI parses it
sys.exit(main())
