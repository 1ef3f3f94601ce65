"""Task heads: what follows the network inside the step graph, for a task.

A head gives the per-sample loss that backward starts from and per-sample metric
values; the step graph sums both on the devices (no host sync per batch) and
``DataParallel.read_metrics`` divides by the sample count. The protocol, for a user's
own task::

    Head(loss, metrics={"name": fn}, combine=None)

* ``loss``: a ``gluon.loss.Loss`` (or any HybridBlock) mapping ``(output, label)`` to
  one loss per sample, shape ``(n,)``;
* ``metrics``: name -> ``fn(F, output, label)`` giving one value per sample, ``(n,)``,
  written with the legacy operators of ``F`` (``mx.nd``/``mx.sym``): a figure that is a
  mean over samples (accuracy, squared error);
* ``combine``: ``fn(F, outputs)`` folding an ensemble's ``(n, K, ...)`` outputs into one
  ``(n, ...)`` output (default: their mean).

Heads run in the legacy API whatever the model's: gluon_gpu converts the model output.
"""
import math

import numpy as np
from mxnet import gluon


class Head:
    """A loss and named per-sample metrics (see the module docstring)."""
    task = "custom"
    tallied = 0  # the width of predicted(): 0, no tally

    def __init__(self, loss, metrics=None, combine=None):
        self.loss = loss
        self.metrics = dict(metrics or {})
        self._combine = combine

    @property
    def names(self):
        return tuple(self.metrics)

    def per_sample(self, F, out, y, training=False):
        """``(loss (n,), [metric (n,) per name])``; ``training``: the loss backward starts
        from, which a head may regularize (Classification's label smoothing)."""
        return self.loss_of(F, out, y, training), [fn(F, out, y) for fn in self.metrics.values()]

    def loss_of(self, F, out, y, training=False):  # pylint: disable=unused-argument
        """The loss alone, ``(n,)`` (a mixed sample's partner has no metrics)."""
        return self.loss(out, y)

    def combine(self, F, outs):
        """An ensemble's outputs ``(n, K, ...)`` as one output ``(n, ...)``."""
        return self._combine(F, outs) if self._combine else F.mean(outs, axis=1)

    def exploded(self, loss):  # pylint: disable=unused-argument
        """Whether a finite mean ``loss`` is one no converging run reaches (a task
        without a natural loss scale: never; NaN/inf is caught apart)."""
        return False

    def predicted(self, F, out):  # pylint: disable=unused-argument
        """Evaluation only: per sample, ``(n, tallied)`` counts summed over the validation
        set (Classification: its predicted class, one-hot), or None."""
        return None

    def tally_figures(self, tally):  # pylint: disable=unused-argument
        """The figures of the evaluation from ``tally``, the host sums of predicted()."""
        return {}


def _accuracy(F, out, y):
    return F.argmax(out, axis=-1) == y


def _top5(F, out, y):
    return F.sum(F.broadcast_equal(F.topk(out, axis=-1, k=5), F.reshape(y, shape=(-1, 1))), axis=-1)


def _squared_error(F, out, y):
    return F.mean(F.square(out - F.reshape_like(y, out)), axis=0, exclude=True)


def _absolute_error(F, out, y):
    return F.mean(F.abs(out - F.reshape_like(y, out)), axis=0, exclude=True)


def _mean_softmax(F, outs):
    """Log of the members' mean softmax: its argmax is the vote, and softmax
    cross-entropy on it is the ensemble's negative log-likelihood."""
    return F.log(F.mean(F.softmax(outs, axis=-1), axis=1))


class Classification(Head):
    """Softmax cross-entropy; accuracy, and top-5 accuracy above 5 classes (when the
    class count is given). ``label_smoothing`` EPS: training targets 1-EPS+EPS/K on the
    class and EPS/K on each class (Szegedy et al.; GluonCV's --label-smoothing);
    evaluation and the metrics keep the labels as they are."""
    task = "classify"

    # Guessing uniformly costs ln(classes); a mean cross-entropy 100 times that needs
    # logits hundreds apart on wrong classes: the weights have blown up (SGD at --lr 3 on
    # LeNet: 7719 after one epoch, 1.3e6 after three, accuracy at chance throughout).
    EXPLODED = 100

    def __init__(self, classes=None, label_smoothing=0.0):
        metrics = {"acc": _accuracy}
        if classes and classes > 5:
            metrics["top5"] = _top5
        super().__init__(gluon.loss.SoftmaxCrossEntropyLoss(), metrics, _mean_softmax)
        self.limit = self.EXPLODED * math.log(max(classes or 1000, 2))
        if label_smoothing and not classes:
            raise ValueError("label smoothing needs the number of classes")
        self.classes, self.smoothing, self.tallied = classes, label_smoothing, classes or 0
        self._soft_loss = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

    def loss_of(self, F, out, y, training=False):
        if not (training and self.smoothing):
            return self.loss(out, y)
        spread = self.smoothing / self.classes
        return self._soft_loss(out, F.one_hot(y, depth=self.classes, on_value=1 - self.smoothing + spread,
                                              off_value=spread))

    def exploded(self, loss):
        return loss > self.limit

    def predicted(self, F, out):
        return F.one_hot(F.argmax(out, axis=-1), depth=self.classes) if self.classes else None

    def tally_figures(self, tally):
        """``predicted_classes``: how many classes were predicted at least once."""
        return {"predicted_classes": int(np.count_nonzero(tally))} if self.classes else {}


class Regression(Head):
    """L2 loss (half the squared error); mean squared and mean absolute error."""
    task = "regress"

    def __init__(self):
        super().__init__(gluon.loss.L2Loss(), {"mse": _squared_error, "mae": _absolute_error})


HEADS = {"classify": Classification, "regress": Regression}  # the tasks by name: --task
TASKS = tuple(HEADS)


def head_for(task, classes=None, label_smoothing=0.0):
    if task not in HEADS:
        raise ValueError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
    if label_smoothing and task != "classify":
        raise ValueError(f"label smoothing applies to classification, not to task {task}")
    return Classification(classes, label_smoothing) if task == "classify" else HEADS[task]()


def as_head(head):
    """A Head from a Head, a task name, or None (classification)."""
    return head if isinstance(head, Head) else (head_for(head) if head else Classification())


def as_heads(head):
    """``(the first head, each member's heads or None)`` of ``head``: one (as_head takes
    it), or a list of one per member (a sweep's: label smoothing differs)."""
    if isinstance(head, list):
        heads = [as_head(h) for h in head]
        return heads[0], heads
    return as_head(head), None
