"""LeNet as MXNet's 'Use GPUs' tutorial writes it, for any input shape and output width."""
from mxnet.gluon import nn

def lenet(outputs=10, channels=1, fused=False):
    """The tutorial's LeNet (its parameter files and ours are interchangeable),
    hybridizable, for ``channels``-channel images and ``outputs`` outputs.

    ``fused=True``: each conv -> ReLU -> max-pool pair runs as one compiled CPU operator
    (fused_conv.py; the operator must be loaded) with the same parameters, names and
    file keys, and the same initial values for the same seed.

    The layers are made inside the net's name scope, so their parameter names do not
    depend on how many layers the process made before: ``gluon.Trainer`` numbers
    parameters by sorted name and ``save_states`` stores optimizer state by that number,
    so with global names (conv9 vs conv10 sort differently) a resume in another process
    state would hand one layer's momentum to another."""
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(*conv_stages(channels, 1, fused))
        net.add(nn.Dense(120, activation="relu"),
                nn.Dense(84, activation="relu"),
                nn.Dense(outputs))
    return net


def conv_stages(channels=1, members=1, fused=False):
    """LeNet's two conv -> ReLU -> max-pool stages, for ``members`` LeNets side by side
    (channel groups, as in an ensemble), as four blocks to make inside the caller's name
    scope: Conv2D, MaxPool2D, Conv2D, MaxPool2D; with ``fused``, each conv + pool pair is
    one ConvReluPool followed by a PooledAbove where the pool stood (same parameters)."""
    k = members
    if fused:
        from .fused_conv import ConvReluPool, PooledAbove
        return (ConvReluPool(6 * k, 5, in_channels=channels * k, groups=k, data_grad=False), PooledAbove(),
                ConvReluPool(16 * k, 3, in_channels=6 * k, groups=k), PooledAbove())
    return (nn.Conv2D(6 * k, 5, groups=k, in_channels=channels * k, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(16 * k, 3, groups=k, in_channels=6 * k, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2))
