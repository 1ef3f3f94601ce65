"""A trained network as it is served: samples as stored in, the answer out, one graph.

The training graph takes normalized float32 inputs and gives logits (an ensemble:
every member's side by side, in gluon_gpu's own layouts). A served model takes the
samples as the data stores them (uint8 pixels, or float32 features), normalizes them
exactly as training did, and gives class probabilities (classification) or the
prediction (regression); an ensemble gives the mean of its members' answers (the mean
softmax, whose argmax is the vote), as ``predict`` does. Built from MXNet's own
operators alone, so that MXNet's exporters and other runtimes can read it.
"""
import mxnet as mx
from mxnet import gluon

from ..core.step.array_api import semantics
from ..core.step.members import member_count
from .fused_lenet import extract_member
from .loading import load_model


class Servable(gluon.HybridBlock):
    """``transform`` (stored sample -> normalized float32), then each of ``nets``; their
    softmax (``task`` classify) or output, averaged over the nets. ``log``: the log of
    that softmax, which evaluation's loss takes as it takes logits (log_softmax of it is
    itself), as exactly as the training graph computes it."""

    def __init__(self, nets, transform, task, log=False):
        super().__init__(prefix="servable_")
        self.nets, self.transform, self.task, self.log = list(nets), transform, task, log
        self.register_child(transform, "transform")
        for k, net in enumerate(self.nets):
            self.register_child(net, str(k))

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        x = self.transform(x)
        outs = [net(x) for net in self.nets]
        if self.task != "classify":
            return outs[0] if len(outs) == 1 else F.add_n(*outs) / len(outs)
        if len(outs) == 1:
            return F.log_softmax(outs[0], axis=-1) if self.log else F.softmax(outs[0], axis=-1)
        mean = F.add_n(*[F.softmax(out, axis=-1) for out in outs]) / len(outs)
        return F.log(mean) if self.log else mean


def servable_model(path, spec, model=None, member=None, log=False, arrays=None):
    """The Servable of the parameter file ``path`` for data ``spec`` (a DataSpec): every
    member of an ensemble or sweep, or ``member`` alone. Built in the legacy API on the
    CPU, with MXNet's convolution rather than gluon_gpu's fused operator (same parameters),
    which only gluon_gpu can load."""
    with semantics(False):
        net = load_model(path, mx.cpu(), model, input_shape=spec.input_shape, outputs=spec.outputs,
                         fused_conv="off", member=member, arrays=arrays)
        members = member_count(net)
        nets = [net] if members == 1 else [extract_member(net, k, input_shape=spec.input_shape)
                                           for k in range(members)]
        transform = spec.transform()
        transform.initialize(ctx=mx.cpu())
        servable = Servable(nets, transform, spec.task, log)
        servable.hybridize()
    return servable
