"""A regression from numpy arrays: the targets are floats, so the task is regression
(L2 loss; MSE and MAE reported), trained on every device.

    python examples/regression_arrays.py [EPOCHS]
"""
import sys

import numpy as np
from mxnet.gluon import nn

import gluon_gpu
from gluon_gpu.data import DevicePipeline, from_arrays

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
rng = np.random.default_rng(0)
x = rng.uniform(-2, 2, size=(4096, 8)).astype(np.float32)
weights = rng.normal(size=(8, 2))
y = np.tanh(x @ weights) + 0.1 * np.sin(3 * x[:, :2])          # two targets per sample
data = from_arrays(x[:3584], y[:3584], x[3584:], y[3584:])     # float targets: regression
print(f"task {data.spec.task}, {data.spec.outputs} outputs, inputs {data.spec.input_shape}")

net = nn.HybridSequential()
net.add(nn.Dense(64, activation="relu"), nn.Dense(64, activation="relu"), nn.Dense(data.spec.outputs))
with gluon_gpu.devices("all") as ctx:
    dp = gluon_gpu.DataParallel(net, ctx, "adam", {"learning_rate": 0.003}, head=data.spec.task,
                                transform=data.spec.transform(), batch_size=128)
    train = DevicePipeline(data.train_x, data.train_y, 128, ctx, seed=0)
    val = DevicePipeline(data.val_x, data.val_y, 128, ctx, shuffle=False)
    for epoch in range(epochs):
        for xb, yb in train.epoch(epoch):
            dp.step(xb, yb, return_loss=False)
        m, v = dp.read_metrics(), dp.evaluate(val.epoch(0))
        print(f"epoch {epoch + 1}: loss {m['loss']:.4f} val-mse {v['mse']:.4f} val-mae {v['mae']:.4f}")
