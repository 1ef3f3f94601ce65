"""MXNet's "Use GPUs" tutorial loop, numpy API and all, with gluon_gpu doing the devices.

    python examples/tutorial_numpy.py [LIMIT]    # LIMIT: training samples to use (default all)

The network is the tutorial's, written as it writes it (``npx.set_np()``,
``nn.Sequential`` without Flatten); gluon_gpu takes the API from the model. At the end
the saved parameters are loaded back the tutorial's way, ``net.load_parameters(path,
ctx=...)``, into a fresh copy of the tutorial's network.
"""
import os
import sys

from mxnet import npx
from mxnet.gluon import nn

import gluon_gpu
from gluon_gpu.core.step.params import save_parameters
from gluon_gpu.data import DevicePipeline, load_dataset

npx.set_np()


def tutorial_lenet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(channels=6, kernel_size=5, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=16, kernel_size=3, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Dense(120, activation="relu"),
            nn.Dense(84, activation="relu"),
            nn.Dense(10))
    return net


limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
data = load_dataset("fashion-mnist", limit=limit)               # arrays + what the run needs to know
with gluon_gpu.devices("all") as ctx:                            # every GPU, else the CPU cores
    net = tutorial_lenet()
    dp = gluon_gpu.DataParallel(net, ctx, "sgd", {"learning_rate": 0.1}, batch_size=256,
                                head=gluon_gpu.Classification(10), transform=data.spec.transform())
    train = DevicePipeline(data.train_x, data.train_y, batch_size=256, ctx=ctx, seed=0)
    valid = DevicePipeline(data.val_x, data.val_y, batch_size=256, ctx=ctx, shuffle=False)
    for epoch in range(2):
        for x, y in train.epoch(epoch):                          # batches already split per device
            dp.step(x, y, return_loss=False)                     # forward + backward everywhere, one update
        m = dp.read_metrics()                                    # the one host sync of the epoch
        print(f"epoch {epoch + 1}: loss {m['loss']:.3f} train-acc {m['acc']:.3f} "
              f"val-acc {dp.evaluate(valid.epoch(0))['acc']:.3f}")
    os.makedirs("runs", exist_ok=True)
    save_parameters(net, "runs/tutorial-net.params")             # one format both APIs read

    again = tutorial_lenet()                                     # the tutorial's own loading
    again.load_parameters("runs/tutorial-net.params", ctx=ctx)
    check = gluon_gpu.DataParallel(again, ctx, head=gluon_gpu.Classification(10), transform=data.spec.transform())
    print(f"reloaded: val-acc {check.evaluate(valid.epoch(0))['acc']:.3f}")
