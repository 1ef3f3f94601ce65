"""The tutorial's LeNet in PyTorch eager, with a trained gluon_gpu LeNet's weights: the
PyTorch row of ``bench --inference``. Run as a script by an interpreter that has
PyTorch (gluoncv refuses to import beside PyTorch 2, so never in gluon_gpu's process):

    PY torch_lenet.py WEIGHTS.npz INPUTS.npz BATCH REPEATS

prints one JSON line: the seconds of each timed pass over the inputs and the accuracy.
Imports nothing of gluon_gpu or MXNet when run so.
"""
import json
import sys
import time

import numpy as np


def save_weights(net, path):
    """The weights of a (gluon_gpu, unfused) LeNet in layer order: w0, b0, w1, ..."""
    arrays = [p.data().asnumpy() for p in net.collect_params().values()]
    np.savez(path, **{f"a{i}": a for i, a in enumerate(arrays)})


def main(weights, inputs, batch, repeats):
    import torch
    from torch import nn
    from torch_train import lenet  # pylint: disable=import-outside-toplevel  # its neighbour, as a script
    torch.set_grad_enabled(False)
    w = np.load(weights)
    arrays = [torch.from_numpy(w[f"a{i}"]) for i in range(len(w.files))]
    net = lenet(nn, arrays[0].shape[1], arrays[-1].shape[0], arrays[4].shape[1]).eval()
    layers = [m for m in net if isinstance(m, (nn.Conv2d, nn.Linear))]
    for layer, (weight, bias) in zip(layers, zip(arrays[0::2], arrays[1::2])):
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    data = np.load(inputs)
    x, y = torch.from_numpy(data["x"]), data["y"]
    mean = torch.tensor(data["mean"], dtype=torch.float32).reshape(1, -1, 1, 1)
    std = torch.tensor(data["std"], dtype=torch.float32).reshape(1, -1, 1, 1)
    scale = float(data["scale"])

    def one_pass():  # as evaluate: normalize, forward, count the right answers
        right = 0
        for i in range(0, len(x), batch):
            out = net((x[i:i + batch].float() * scale - mean) / std)
            right += int((out.argmax(1).numpy() == y[i:i + batch]).sum())
        return right / len(x)
    acc = one_pass()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        acc = one_pass()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds, "acc": acc, "torch": torch.__version__}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
