"""``--ema DECAY``: an exponential moving average of the weights (Polyak averaging, as
timm's ModelEma and TensorFlow's ExponentialMovingAverage keep it).

After every optimizer update the average moves towards the parameters:
``average = DECAY * average + (1 - DECAY) * parameter``, for every parameter including
BatchNorm's running statistics, on the first device (replicas are identical). At each
epoch's end the run validates the average as well (``ema_val_*`` figures), saves it in
checkpoints (so a resume continues it exactly) and as ``RUN/ema.params``, a plain
parameter file; ``--monitor`` takes it for ``best.params`` when its figure is better.
"""
import contextlib

from mxnet import nd

from ..step.array_api import legacy
from ..step.params import assign_parameters, parameter_arrays, read_parameter_file
from .callbacks import Callback
from .fit import validate


class WeightAverage(Callback):
    """Callback: the moving average of ``dp``'s parameters, updated after each update;
    at an epoch's end, its figures on ``val_pipeline`` join the record as ``ema_val_*``."""

    FILE = "ema.params"

    def __init__(self, dp, decay, val_pipeline=None):
        self.dp, self.decay, self.val = dp, decay, val_pipeline
        self.params = dp.net._collect_params_with_prefix()  # pylint: disable=protected-access
        first = dp.ctx[0]
        self.average = {name: legacy(p.data(first)).copy() for name, p in self.params.items()}

    def on_step(self, epoch, batch):  # pylint: disable=unused-argument
        """Move the average, unless the step only accumulated gradients (no update)."""
        if self.dp.pending_batches:
            return
        first = self.dp.ctx[0]
        for name, p in self.params.items():
            average = self.average[name]
            nd.elemwise_add(average * self.decay, legacy(p.data(first)) * (1 - self.decay), out=average)

    def on_epoch_end(self, record, history):
        if self.val is not None and record.get("validated", True):
            with self.swapped_in():
                record.update({"ema_" + name: value for name, value in validate(self.dp, self.val).items()})

    def arrays(self):
        """``{structural name: NDArray}``, as ``net.params`` names them."""
        return dict(self.average)

    def load(self, path):
        """The average a checkpoint saved (a run resumed)."""
        for name, array in read_parameter_file(path).items():
            if name in self.average:
                self.average[name][:] = array.astype(self.average[name].dtype)

    @contextlib.contextmanager
    def swapped_in(self):
        """The network holds the average on every device inside the block, its own
        parameters again after it."""
        own = parameter_arrays(self.dp.net)
        assign_parameters(self.dp.net, self.average, self.dp.ctx, "the moving average")
        try:
            yield
        finally:
            assign_parameters(self.dp.net, own, self.dp.ctx, "the parameters")

    def on_train_end(self, history, status, reason=None):
        pass
