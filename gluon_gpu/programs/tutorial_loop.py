"""The baseline: the training loop of MXNet's "Use GPUs" tutorial, kept as the tutorial
writes it (non-hybridized ``nn.Sequential`` LeNet, ``DataLoader`` with
``transform_first(ToTensor, Normalize)`` and 4 workers, ``split_and_load`` per batch,
``l.sum().asscalar()`` per batch), so the benchmark can time it beside ours. For any
other model the same loop trains gluoncv's zoo network as GluonCV's CIFAR script does:
built by ``model_zoo.get_model(name, classes=...)`` and hybridized.

The only change: the tutorial's ``datasets.FashionMNIST`` downloads, so the arrays
(``(N, 1, 28, 28)`` uint8, as gluon_gpu's data layer stores them) come from our IDX
reader through an ``ArrayDataset``, laid out ``(N, 28, 28, 1)`` as the tutorial's are.
"""
from time import time

from mxnet import autograd, gluon, init, nd
from mxnet.gluon import nn
from mxnet.gluon.data.vision import transforms

from ..core.platform.errors import UserError
from ..data.augment import parse_augment
from ..models.zoo import ALIASES
from .run import exclude_from_weight_decay, optimizer_params


def tutorial_lenet():
    net = nn.Sequential()
    net.add(nn.Conv2D(channels=6, kernel_size=5, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=16, kernel_size=3, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(),
            nn.Dense(120, activation="relu"),
            nn.Dense(84, activation="relu"),
            nn.Dense(10))
    return net


def tutorial_net(model, classes):
    """The tutorial's LeNet, or a GluonCV zoo model."""
    if model == "lenet":
        return tutorial_lenet()
    from gluoncv import model_zoo
    net = model_zoo.get_model(ALIASES.get(model, model), classes=classes)
    net.hybridize()
    return net


def tutorial_loaders(train_images, train_labels, test_images, test_labels, batch_size, num_workers, recipe):
    """The tutorial's DataLoaders; a recipe's host transforms on the training samples."""
    transformer = transforms.Compose([transforms.ToTensor(), transforms.Normalize(0.13, 0.31)])
    augmented = transformer
    if recipe:  # uint8 HWC transforms, ToTensor, float CHW ones (rotation), Normalize
        before, after = recipe.transforms
        augmented = transforms.Compose(before + [transforms.ToTensor()] + after + [transforms.Normalize(0.13, 0.31)])
    mnist_train = gluon.data.ArrayDataset(nd.array(train_images.transpose(0, 2, 3, 1), dtype='uint8'),
                                          train_labels.astype('float32'))
    mnist_valid = gluon.data.ArrayDataset(nd.array(test_images.transpose(0, 2, 3, 1), dtype='uint8'),
                                          test_labels.astype('float32'))
    train_data = gluon.data.DataLoader(mnist_train.transform_first(augmented),
                                       batch_size=batch_size, shuffle=True, num_workers=num_workers)
    valid_data = gluon.data.DataLoader(mnist_valid.transform_first(transformer),
                                       batch_size=batch_size, num_workers=num_workers)
    return train_data, valid_data


def tutorial_trainer(net, devices, recipe):
    """``(loss, trainer)``, the network initialized on ``devices``, as the tutorial (or the recipe) has them."""
    net.initialize(force_reinit=True, ctx=devices, init=init.Xavier())
    if recipe and recipe.no_wd:
        exclude_from_weight_decay(net)
    softmax_cross_entropy = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=not (recipe and recipe.smoothing))
    trainer = gluon.Trainer(net.collect_params(), recipe.optimizer if recipe else 'sgd',
                            recipe.optimizer_params if recipe else {'learning_rate': 0.1})
    return softmax_cross_entropy, trainer


def run(train_images, train_labels, test_images, test_labels, devices, epochs,
        batch_size=256, num_workers=None, on_epoch=None, model="lenet", classes=10, recipe=None):
    """Train as the tutorial does; returns per-epoch seconds and the final validation accuracy.
    ``num_workers``: its DataLoaders' (None: the tutorial's 4).

    ``recipe`` (bench --to-accuracy): a :class:`BaselineRecipe` the loop trains with as GluonCV's
    scripts do: its optimizer and schedule, per-sample host transforms, smoothed one-hot
    labels; it then validates after every epoch inside the timed span, passes the accuracy
    to ``on_epoch(epoch, loss, seconds, accuracy)``, and stops at ``recipe.until``."""
    num_workers = 4 if num_workers is None else num_workers
    net = tutorial_net(model, classes)
    train_data, valid_data = tutorial_loaders(train_images, train_labels, test_images, test_labels, batch_size,
                                              num_workers, recipe)
    softmax_cross_entropy, trainer = tutorial_trainer(net, devices, recipe)
    seconds = []
    for epoch in range(epochs):
        train_loss = 0.
        tic = time()
        for data, label in train_data:
            if recipe and recipe.smoothing:  # GluonCV's label smoothing: a smoothed one-hot target
                eps = recipe.smoothing
                label = nd.one_hot(label, classes, on_value=1 - eps + eps / classes, off_value=eps / classes)
            data_list = gluon.utils.split_and_load(data, devices)
            label_list = gluon.utils.split_and_load(label, devices)
            with autograd.record():
                losses = [softmax_cross_entropy(net(X), y)
                          for X, y in zip(data_list, label_list)]
            for l in losses:
                l.backward()
            trainer.step(batch_size)
            train_loss += sum([l.sum().asscalar() for l in losses])
        accuracy = _accuracy(net, valid_data, devices, len(test_labels)) if recipe else None
        seconds.append(time() - tic)
        if on_epoch:
            on_epoch(epoch, train_loss / len(train_data) / batch_size, seconds[-1], accuracy)
        if recipe and accuracy >= recipe.until:
            return seconds, accuracy
    return seconds, _accuracy(net, valid_data, devices, len(test_labels))


def _accuracy(net, valid_data, devices, samples):
    valid_acc = 0.
    for data, label in valid_data:
        data_list = gluon.utils.split_and_load(data, devices)
        label_list = gluon.utils.split_and_load(label, devices)
        valid_acc += sum([(net(X).argmax(axis=1) == y.astype('float32')).sum().asscalar()
                          for X, y in zip(data_list, label_list)])
    return valid_acc / samples


class BaselineRecipe:
    """A run configuration's recipe as the baseline loop trains it: ``optimizer`` and
    ``optimizer_params`` (run.optimizer_params: the same schedule), ``transforms`` (GluonCV's
    and Gluon's host transforms for ``config.augment``), ``smoothing``, ``no_wd``, and
    ``until``, the accuracy that ends it."""

    def __init__(self, config, iters_per_epoch, until, size):
        check_recipe(config, size)
        self.optimizer, self.optimizer_params = config.optimizer, optimizer_params(config, iters_per_epoch)
        self.transforms = host_transforms(parse_augment(config.augment), size)
        self.smoothing, self.no_wd, self.until = config.label_smoothing, config.no_wd, until


def check_recipe(config, size):
    """Refuse what the baseline loop cannot train as ``config`` says (UserError, one line)."""
    if config.mixup or config.cutmix or config.ema or config.tta:
        raise UserError("the baseline loop trains without --mixup, --cutmix, --ema and --tta; leave them out of "
                        "the recipe to compare time to accuracy, or leave the baseline out (--baseline none)")
    host_transforms(parse_augment(config.augment), size)


def host_transforms(components, size):
    """``(before, after)``: per-sample transforms of images of ``size`` (H, W) in the
    DataLoader's workers, as GluonCV's scripts augment, one per ``--augment`` component:
    those of uint8 HWC images (before ToTensor) and those of float CHW ones (after)."""
    from gluoncv.data.transforms import block
    before, after = [], []
    for name, p in components.items():
        if name in ("flip", "vflip"):
            flip = transforms.RandomFlipLeftRight() if name == "flip" else transforms.RandomFlipTopBottom()
            before.append(flip if p == 0.5 else transforms.RandomApply(flip, p * 2))  # flips half the time it runs
        elif name == "crop":  # GluonCV's CIFAR recipe: RandomCrop(32, pad=4)
            before.append(block.RandomCrop(size, pad=int(p)))
        elif name == "rotate":
            after.append(transforms.RandomRotation((-p, p)))
        else:
            raise UserError(f"the baseline loop has no host transform for `augment` {name}")
    return before, after
