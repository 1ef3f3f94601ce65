"""Swapping blocks inside a built network for equivalents: by every block that holds
them (as a child, and as the attribute that held it), whatever the network's nesting.

``use_mean_pooling``: MXNet 1.9's oneDNN backward of GlobalAvgPool2D hands its gradient
on in a layout (``acdB16b``) unlike the BatchNorm output before it (``aBcd16b``), so both
that pooling backward and the BatchNorm backward fall to oneDNN's reference kernels
(``DNNL_VERBOSE=1``: ``pooling_v2,ref:any`` and ``bnorm_ref:any``, with the ``sum``
primitives around them on ``simple:any``). A mean over the spatial axes is the same
function, with no parameters, and its gradient keeps the layouts oneDNN's fast kernels
take: a ResNet-20 training step on one CPU context took 274-279 ms instead of 627-634 ms
(README "Performance").
"""
from mxnet import gluon


class GlobalMeanPool(gluon.HybridBlock):
    """GlobalAvgPool2D (NCHW) as ``mean`` over H and W, keeping the axes."""

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return F.mean(x, axis=(2, 3), keepdims=True)


def replace_blocks(net, match, make):
    """Replace, in place, every block of ``net`` for which ``match(block)`` holds by
    ``make(block)``; returns how many. Replaced blocks are not searched further."""
    replaced = 0
    stack = [net]
    while stack:
        block = stack.pop()
        for name, child in list(block._children.items()):  # pylint: disable=protected-access
            if match(child):
                new = make(child)
                block._children[name] = new  # pylint: disable=protected-access
                for attribute, value in vars(block).items():  # Sequential blocks hold children by index only
                    if value is child:
                        object.__setattr__(block, attribute, new)
                replaced += 1
            else:
                stack.append(child)
    return replaced


def use_mean_pooling(net):
    """Every NCHW GlobalAvgPool2D of ``net`` becomes a GlobalMeanPool (see above)."""
    return replace_blocks(net, lambda b: isinstance(b, gluon.nn.GlobalAvgPool2D)
                          and b._kwargs.get("layout", "NCHW") == "NCHW",  # pylint: disable=protected-access
                          lambda b: GlobalMeanPool(prefix=b.prefix))
