"""Your own model on your own image folder (DIR/train/<class>/*, DIR/val/<class>/*).

    python examples/own_model_folder.py DIR [EPOCHS]

The data layer reads the folder (classes from the folder names, any image size or
colour), gluon_gpu trains your block on every device with the same run machinery as
``python -m gluon_gpu.train`` (which, for the zoo models, is ``--dataset folder --data-dir DIR``).
"""
import sys

from mxnet.gluon import nn

import gluon_gpu
from gluon_gpu.data import load_dataset
from gluon_gpu.programs.config import RunConfig
from gluon_gpu.programs.run import build_run


class SmallConvNet(nn.HybridBlock):
    """A user's own network: any HybridBlock (a plain Block runs un-hybridized)."""

    def __init__(self, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential()
            for channels in (16, 32):
                self.features.add(nn.Conv2D(channels, 3, padding=1, activation="relu"), nn.MaxPool2D(2))
            self.features.add(nn.GlobalAvgPool2D())
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return self.output(self.features(x))


data_dir, epochs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
data = load_dataset("folder", data_dir)
print(f"{len(data.train_x)} training images of {data.spec.input_shape}, classes {data.spec.classes}")
config = RunConfig(batch_size=32, lr=0.05, momentum=0.9, epochs=epochs)
with gluon_gpu.devices("all") as ctx:
    run = build_run(config, ctx, data=data, model=SmallConvNet(len(data.spec.classes)))
    for epoch in range(epochs):
        for x, y in run.train.epoch(epoch):
            run.dp.step(x, y, return_loss=False)
        train = run.dp.read_metrics()
        val = run.dp.evaluate(run.val.epoch(0))
        print(f"epoch {epoch + 1}: loss {train['loss']:.3f} val-acc {val['acc']:.3f}")
