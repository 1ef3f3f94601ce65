"""A multilayer perceptron for feature vectors (``--model mlp``; ``auto`` picks it for
data that is not images)."""
from mxnet.gluon import nn


def mlp(outputs, hidden=(128, 64)):
    net = nn.HybridSequential()
    with net.name_scope():
        for units in hidden:
            net.add(nn.Dense(units, activation="relu"))
        net.add(nn.Dense(outputs))
    return net
