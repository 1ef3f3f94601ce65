"""PyTorch's rows of the benchmark run in another interpreter (``--torch-python``):
gluoncv refuses to import beside PyTorch 2, so never in gluon_gpu's process. The
scripts (torch_lenet.py, torch_train.py) import nothing of gluon_gpu or MXNet."""
import numpy as np

from .children import lines


def save_samples(path, spec, **arrays):
    """``arrays`` (stored samples, labels) and ``spec``'s normalization, as the scripts read them."""
    np.savez(path, mean=np.array(spec.mean), std=np.array(spec.std), scale=spec.scale, classes=spec.outputs, **arrays)


def torch_lines(python, script, *args, seconds=0):
    """The stdout lines of ``python script args...`` as they come; UserError naming
    ``torch_python`` with the script's last line if it fails; DeadlineError past
    ``seconds`` (bench --timeout)."""
    return lines([python, script, *map(str, args)], f"`torch_python` {python}", seconds)
