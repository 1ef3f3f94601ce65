"""``python tests/pooled_model_run.py FOLDER``: a network that costs almost no
compute (a 16x16 average pool and one dense layer), in batches of 16 (a batch of
256x256 RGB images is 12 MiB as float32, and the step holds a few), trained on an image folder by
gluon_gpu's run machinery with ``--pipeline auto``, for the memory-cap test, where the
decoding and the pipeline's memory are what is measured. Prints one JSON line: the
pipeline the run chose and its validation accuracy."""
import json
import sys

from mxnet.gluon import nn

import gluon_gpu
from gluon_gpu.data import load_dataset
from gluon_gpu.programs.config import RunConfig
from gluon_gpu.programs.run import build_run

folder = sys.argv[1]
data = load_dataset("folder", folder, decoded=False)  # build_run decides: in memory or streamed
net = nn.HybridSequential()
net.add(nn.AvgPool2D(pool_size=16, strides=16), nn.Flatten(), nn.Dense(len(data.spec.classes)))
config = RunConfig(devices="cpu", batch_size=16, lr=0.1, momentum=0.9, epochs=2)
with gluon_gpu.devices(config.devices) as ctx:
    run = build_run(config, ctx, data=data, model=net)
    for epoch in range(config.epochs):
        for batch in run.train.epoch(epoch):
            run.dp.step(*batch, return_loss=False)
        run.dp.read_metrics()
    val = run.dp.evaluate(run.val.epoch(0))
print(json.dumps({"pipeline": run.pipeline, "val_acc": val["acc"]}))
