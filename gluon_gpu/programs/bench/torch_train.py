"""gluon_gpu's networks in PyTorch eager, trained with a gluon_gpu run configuration:
the tutorial's LeNet (the PyTorch row of the scaling table, ``bench --torch-python``)
and gluoncv's CIFAR ResNet v1 (``cifar_resnet20_v1`` and its deeper kin: the PyTorch
rows of ``bench --to-accuracy``). Run as a script by an interpreter that has PyTorch
(gluoncv refuses to import beside PyTorch 2, so never in gluon_gpu's process):

    PY torch_train.py DATA.npz CONFIG.json TARGET|none float32|bfloat16

DATA.npz: the stored samples (``train_x``, ``train_y``, ``val_x``, ``val_y``, uint8
images as gluon_gpu keeps them) and the normalization (``mean``, ``std``, ``scale``);
CONFIG.json: the run's configuration (recipe applied). ``bfloat16``: the step under
``torch.autocast("cpu", dtype=torch.bfloat16)``. Prints one JSON line per epoch,
``{"seconds", "train_seconds", "val_acc", "torch", "threads", "parameters"}`` (seconds
since the start, training and validation; the epoch's training alone; the accuracy, null
for an epoch the configuration's ``val_every`` leaves unvalidated; PyTorch's version and
threads; the network's parameter count), until the validation accuracy reaches TARGET
(``none``: every epoch) or the last epoch. Imports nothing of gluon_gpu or MXNet when
run so; a configuration it cannot follow is one line on stderr, exit 2.
"""
import json
import math
import sys
import time

import numpy as np

DEPTHS = {"cifar_resnet20_v1": 3, "cifar_resnet56_v1": 9, "cifar_resnet110_v1": 18}
DEFAULTS = {"optimizer": "sgd", "mixup": 0.0, "cutmix": 0.0, "accumulate": 1, "clip_grad": None, "sync_bn": False,
            "ema": None}
ERASE_AREA, ERASE_ASPECT = (0.02, 0.4), (0.3, 1 / 0.3)  # as gluon_gpu's augment.py


def refused(config):
    """What of ``config`` this script cannot train as gluon_gpu would, or ''."""
    if config["model"] not in ("lenet", *DEPTHS):
        return f"model {config['model']}: the PyTorch rows train lenet, {', '.join(DEPTHS)}"
    for name, default in DEFAULTS.items():
        if (config.get(name) or default) != default and not (name == "optimizer" and config[name] == "nag"):
            return f"{name} {config[name]}: not in the PyTorch rows' recipe"
    if config.get("lr_mode", "constant") not in ("constant", "cosine", "step"):
        return f"lr_mode {config['lr_mode']}: not in the PyTorch rows' recipe"
    unknown = set(parse_augment(config.get("augment") or "")) - {"flip", "crop", "erase"}
    return f"augment {', '.join(sorted(unknown))}: not in the PyTorch rows' recipe" if unknown else ""


def parse_augment(text):
    presets = {"none": "", "basic": "flip,crop=4", "strong": "flip,crop=4,erase=0.5"}
    defaults = {"flip": 0.5, "crop": 4, "erase": 0.5}
    chosen = {}
    for item in filter(None, presets.get(text, text).split(",")):
        name, _, value = item.partition("=")
        chosen[name] = float(value) if value else defaults.get(name, 0.0)
    return chosen


def build(torch, nn, model, image_shape, classes):
    """``model`` (lenet or a CIFAR ResNet v1) for images of ``image_shape`` (C, H, W)."""
    channels, h, w = image_shape
    if model == "lenet":  # conv 5, pool 2, conv 3, pool 2, as gluon_gpu's infers it
        return lenet(nn, channels, classes, 16 * (((h - 4) // 2 - 2) // 2) * (((w - 4) // 2 - 2) // 2))
    return resnet(torch, nn, DEPTHS[model], channels, classes)


def lenet(nn, channels, classes, flat):
    """The tutorial's LeNet (models/lenet.py), ``flat`` inputs to its first dense layer
    (16 x 5 x 5 for 28x28 images), initialized as gluon_gpu initializes it
    (``mx.init.Xavier()``: uniform, fan average, magnitude 3; zero biases)."""
    net = nn.Sequential(nn.Conv2d(channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
                        nn.Conv2d(6, 16, 3), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                        nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, classes))
    for layer in net:
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    return net


def resnet(torch, nn, depth, channels, classes):
    class Block(nn.Module):  # CIFARBasicBlockV1: relu(body(x) + (downsample(x) or x))
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                      nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

        def forward(self, x):
            return torch.relu(self.body(x) + (self.down(x) if self.down is not None else x))

    layers = [nn.Conv2d(channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16)]  # no ReLU here, as gluoncv's
    cin = 16
    for stage, cout in enumerate((16, 32, 64)):
        for i in range(depth):
            layers.append(Block(cin, cout, 2 if stage and not i else 1))
            cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))


def learning_rate(config, update, per_epoch):
    """The rate at MXNet's update count ``update`` (from 1) of gluoncv's LRSequential as
    gluon_gpu's run.lr_scheduler composes it: a linear warmup reaching ``lr`` at its last
    update, then ``lr_mode`` (clamped to the schedule's last update, as gluoncv does)."""
    warmup, lr, mode = config.get("warmup_epochs", 0), config["lr"], config.get("lr_mode", "constant")
    warm = warmup * per_epoch
    if mode == "constant" and not warm:
        return lr
    decays = [int(e) for e in filter(None, str(config.get("lr_decay_epoch") or "").split(","))] if mode == "step" else []
    epochs = max([config["epochs"]] + decays) + 1 if decays else config["epochs"]
    rest = (epochs - warmup) * per_epoch
    update = min(update, warm + rest - 1)
    if update < warm:
        start = config.get("warmup_lr", 0.0)
        return start + (lr - start) * update / (warm - 1)
    done = min(max(0, update - warm), rest - 1)
    if mode == "cosine":
        return lr * (1 + math.cos(math.pi * done / (rest - 1))) / 2
    return lr * config.get("lr_decay", 0.1) ** sum((e - warmup) * per_epoch <= done for e in decays)


def augment(torch, x, chosen, generator):
    """Flip, crop (zero padding in normalized units: the mean) and erasing, per sample."""
    n, _, h, w = x.shape
    if "flip" in chosen:
        flip = torch.rand(n, generator=generator) < chosen["flip"]
        x[flip] = x[flip].flip(3)
    if "crop" in chosen:
        p = int(chosen["crop"])
        padded = torch.nn.functional.pad(x, (p, p, p, p))
        dy, dx = torch.randint(0, 2 * p + 1, (2, n), generator=generator)
        x = torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])
    if "erase" in chosen:
        for i in np.flatnonzero(np.random.rand(n) < chosen["erase"]):
            area, aspect = np.random.uniform(*ERASE_AREA) * h * w, math.exp(np.random.uniform(*np.log(ERASE_ASPECT)))
            eh, ew = min(h, int(round(math.sqrt(area * aspect)))), min(w, int(round(math.sqrt(area / aspect))))
            top, left = np.random.randint(0, h - eh + 1), np.random.randint(0, w - ew + 1)
            x[i, :, top:top + eh, left:left + ew] = 0.0  # the mean, normalized
    return x


class Trainer:
    """The network, its optimizer (weight decay off biases and BatchNorm with ``no_wd``),
    the loss, the samples and the recipe's learning rate per step."""

    def __init__(self, torch, config, data, autocast):
        from torch import nn
        self.torch, self.config, self.autocast = torch, config, autocast
        seed = config.get("seed", 0)
        torch.manual_seed(seed)
        np.random.seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.mean = torch.tensor(data["mean"], dtype=torch.float32).reshape(1, -1, 1, 1)
        self.std = torch.tensor(data["std"], dtype=torch.float32).reshape(1, -1, 1, 1)
        self.scale = float(data["scale"])
        self.train_x, self.train_y = data["train_x"], torch.from_numpy(data["train_y"].astype(np.int64))
        self.val_x, self.val_y = data["val_x"], data["val_y"].astype(np.int64)
        self.views = tta_views(config.get("tta") or "")
        self.net = build(torch, nn, config["model"], self.train_x.shape[1:], int(data["classes"]))
        flat = [p for p in self.net.parameters() if config.get("no_wd") and p.ndim == 1]
        rest = [p for p in self.net.parameters() if not (config.get("no_wd") and p.ndim == 1)]
        self.optimizer = torch.optim.SGD([{"params": rest, "weight_decay": config.get("wd", 0.0)},
                                          {"params": flat, "weight_decay": 0.0}], lr=config["lr"],
                                         momentum=config.get("momentum", 0.0), nesterov=config.get("optimizer") == "nag")
        self.decays = [group["weight_decay"] for group in self.optimizer.param_groups]
        self.loss = nn.CrossEntropyLoss(label_smoothing=config.get("label_smoothing", 0.0))
        self.chosen, self.batch = parse_augment(config.get("augment") or ""), config["batch_size"]
        self.steps, self.step = math.ceil(len(self.train_x) / self.batch), 0

    def update(self, rate):
        """One optimizer step at learning rate ``rate``. MXNet's sgd and nag keep the rate
        inside their momentum (``mom = m * mom - lr * (grad + wd * w)``), PyTorch's outside
        (``buf = m * buf + grad + wd * w``, ``w -= lr * buf``): the same recipe's changing
        rate trains differently (PyTorch's rule killed every ReLU of the LeNet recipe's
        warm-up to 0.2). So PyTorch steps at rate 1 on gradients and decay scaled by
        ``rate``: MXNet's update, for the rows that train our recipe. The standard recipe's
        row (``pytorch_update``) keeps PyTorch's own rule, as its users run it."""
        inside = not self.config.get("pytorch_update")
        for group, wd in zip(self.optimizer.param_groups, self.decays):
            group["lr"], group["weight_decay"] = (1.0, wd * rate) if inside else (rate, wd)
        if inside:
            self.torch._foreach_mul_([p.grad for p in self.net.parameters() if p.grad is not None], rate)
        self.optimizer.step()

    def normalized(self, stored):
        return (self.torch.from_numpy(stored).float() * self.scale - self.mean) / self.std

    def epoch(self, number):
        torch = self.torch
        self.net.train()
        order = np.random.default_rng([self.config.get("seed", 0), number]).permutation(len(self.train_x))
        for i in range(self.steps):
            rows = order[i * self.batch:(i + 1) * self.batch]
            x = augment(torch, self.normalized(self.train_x[rows]), self.chosen, self.generator)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                loss = self.loss(self.net(x), self.train_y[rows])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.update(learning_rate(self.config, self.step + 1, self.steps))
            self.step += 1

    def accuracy(self):
        torch = self.torch
        self.net.eval()
        right = 0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            for i in range(0, len(self.val_x), 256):
                logp = [torch.log_softmax(self.net(self.normalized(v)).float(), 1) for v in self.views(self.val_x[i:i + 256])]
                right += int((sum(logp).argmax(1).numpy() == self.val_y[i:i + 256]).sum())
        return right / len(self.val_x)


def tta_views(text):
    """``--tta`` as gluon_gpu's core/step/tta.py has it: ``x -> [views]`` of stored images:
    the image, its mirror (flip), each moved P pixels down-right and up-left (shift=P),
    zero-filled; the mean of their log-probabilities is the prediction."""
    chosen = dict(item.partition("=")[::2] for item in filter(None, text.split(",")))
    flip, shift = "flip" in chosen, int(chosen.get("shift") or 0)

    def views(x):
        out = [x, np.ascontiguousarray(x[..., ::-1])] if flip else [x]
        if shift:
            h, w = x.shape[2:]
            padded = [np.pad(v, ((0, 0), (0, 0), (shift, shift), (shift, shift))) for v in out]
            out += [np.ascontiguousarray(p[:, :, :h, :w]) for p in padded]
            out += [np.ascontiguousarray(p[:, :, 2 * shift:, 2 * shift:]) for p in padded]
        return out
    return views


def main(data_path, config_path, target, dtype):
    import torch
    with open(config_path) as f:
        config = json.load(f)
    why = refused(config)
    if why:
        print(f"torch_train: {why}", file=sys.stderr)
        return 2
    trainer = Trainer(torch, config, np.load(data_path), dtype == "bfloat16")
    start = time.perf_counter()
    for epoch in range(config["epochs"]):
        epoch_start = time.perf_counter()
        trainer.epoch(epoch)
        train_seconds = time.perf_counter() - epoch_start
        last = epoch + 1 == config["epochs"]
        accuracy = trainer.accuracy() if last or (epoch + 1) % config.get("val_every", 1) == 0 else None
        print(json.dumps({"seconds": time.perf_counter() - start, "train_seconds": train_seconds,
                          "val_acc": accuracy, "torch": torch.__version__, "threads": torch.get_num_threads(),
                          "parameters": sum(p.numel() for p in trainer.net.parameters())}),
              flush=True)
        if target is not None and accuracy is not None and accuracy >= target:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], None if sys.argv[3] == "none" else float(sys.argv[3]), sys.argv[4]))
