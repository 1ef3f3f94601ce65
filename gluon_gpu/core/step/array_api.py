"""MXNet's two array APIs: the legacy ``nd`` API and the numpy API of ``npx.set_np()``.

A model built under ``npx.set_np()`` (as MXNet's tutorials write it) holds
``mx.np.ndarray`` parameters and its layers emit numpy-API operators; a legacy model
holds ``nd.NDArray`` ones. Each must run with its own semantics switched on, and the
two kinds of arrays do not mix in one operator (``_npi_split ... received a legacy
ndarray``). gluon_gpu keeps its own machinery (pipelines, loss/metric heads, metric
sums, gradient buckets) in the legacy API and converts at the model's boundary:
``as_np_ndarray()`` / ``as_nd_ndarray()`` share memory, so crossing costs nothing.
"""
import contextlib

import mxnet as mx


def current_is_np():
    """Whether the numpy API is switched on in this thread (``npx.set_np()``)."""
    return mx.util.is_np_array()


def model_is_np(net):
    """Whether ``net`` is a numpy-API model: its initialized parameters are numpy arrays;
    for a network not initialized yet, whether the numpy API is on now (as when the
    user built it)."""
    for param in net.collect_params().values():
        data = param._data  # pylint: disable=protected-access
        if data:
            return isinstance(data[0], mx.np.ndarray)
    return current_is_np()


@contextlib.contextmanager
def semantics(is_np):
    """Run the enclosed code with numpy semantics on (``is_np``) or off."""
    if is_np:  # MXNet refuses numpy arrays without numpy shapes: shapes on first, off last
        with mx.util.np_shape(True), mx.util.np_array(True):
            yield
    else:
        with mx.util.np_array(False), mx.util.np_shape(False):
            yield


def legacy(x):
    """A legacy NDArray (or Symbol) view of ``x``, whichever API it belongs to."""
    return x.as_nd_ndarray() if isinstance(x, (mx.np.ndarray, mx.sym.np._Symbol)) else x  # pylint: disable=protected-access


def to_api(x, is_np):
    """``x`` (legacy or numpy) as an array of the API ``is_np`` names."""
    x = legacy(x)
    return x.as_np_ndarray() if is_np else x


def call(net, x):
    """``net(x)`` for a legacy input ``x``, in the net's own API; a legacy output."""
    is_np = model_is_np(net)
    with semantics(is_np):
        return legacy(net(to_api(x, is_np)))


def forward_zeros(net, input_shape, ctx):
    """One forward pass of a batch of zeros of ``input_shape`` (one sample's) on ``ctx``:
    a network infers its deferred shapes in its first pass."""
    return call(net, mx.nd.zeros((1,) + tuple(input_shape), ctx=ctx))
