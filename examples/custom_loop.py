"""Your own Gluon loop on every device, with gluon_gpu doing the device handling.

    python examples/custom_loop.py [LIMIT]     # LIMIT: training samples to use (default all)
"""
import sys

import gluon_gpu
from gluon_gpu.data import DevicePipeline, load_split

limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
with gluon_gpu.devices("all") as ctx:                     # every GPU, else the CPU
    net = gluon_gpu.get_model("lenet")
    dp = gluon_gpu.DataParallel(net, ctx, "sgd", {"learning_rate": 0.1}, normalize_in_graph=True,
                                batch_size=256)
    train = DevicePipeline(*load_split("train", limit=limit), batch_size=256, ctx=ctx, seed=0)
    test = DevicePipeline(*load_split("test"), batch_size=256, ctx=ctx, shuffle=False)
    for epoch in range(2):
        for data, label in train.epoch(epoch):            # batches already split per device
            dp.step(data, label)                          # forward + backward everywhere, one update
        m = dp.read_metrics()                             # the one host sync of the epoch
        print(f"epoch {epoch + 1}: loss {m['loss']:.3f} val-acc {dp.evaluate(test.epoch(0)):.3f}")
    net.save_parameters("custom_loop.params")
