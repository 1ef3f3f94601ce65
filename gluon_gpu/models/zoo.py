"""Networks by name: the tutorial's LeNet, its seed-parallel ensemble, and gluoncv's
model zoo (CIFAR-style and ImageNet-style classifiers), built for the data's channels
(their first convolutions infer it) and output width."""
from collections import namedtuple

from ..core.platform.errors import UserError
from .blocks import use_mean_pooling
from .lenet import lenet
from .mlp import mlp

ModelKind = namedtuple("ModelKind", "build images_only what")
ModelKind.__doc__ = """A network of this package: ``build(outputs, channels, fused) -> Block``
(``fused``: LeNet's fused conv operator, ignored by others), whether it needs images
(C, H, W) rather than feature vectors, and what it is (for --help)."""

# This package's networks by name (--model): a new one is its module and a line here;
# any classifier of gluoncv's zoo works without one.
MODELS = {
    "lenet": ModelKind(lenet, True, "the tutorial's LeNet"),
    "mlp": ModelKind(lambda outputs, channels, fused: mlp(outputs), False, "a multilayer perceptron"),
}

# Named in --help; any other classifier of gluoncv's zoo works too.
ZOO_EXAMPLES = ("cifar_resnet20_v1", "cifar_resnet56_v1", "cifar_wideresnet16_10", "resnet18_v1",
                "resnet50_v1b", "mobilenet_v2_1.0", "mobilenet1.0")
# gluoncv spells MobileNetV2 'mobilenetv2_1.0'; users (and issue texts) write 'mobilenet_v2_1.0'.
ALIASES = {f"mobilenet_v2_{w}": f"mobilenetv2_{w}" for w in ("1.0", "0.75", "0.5", "0.25")}


def zoo_names():
    """Every model name gluoncv's zoo knows (imported lazily: gluoncv is slow to import)."""
    from gluoncv import model_zoo
    return model_zoo.get_model_list()


def check_model_name(name):
    if name not in MODELS and ALIASES.get(name, name) not in zoo_names():
        raise UserError(f"unknown `model` {name!r}: {', '.join(MODELS)} or a gluoncv zoo classifier such as "
                        + ", ".join(ZOO_EXAMPLES))


def model_for(name, input_shape):
    """``name``, or for ``auto`` the default for the data: LeNet for images, an MLP for
    feature vectors; a convolutional network for feature vectors is refused."""
    images = len(input_shape) == 3
    if name == "auto":
        return "lenet" if images else "mlp"
    check_model_name(name)
    if not images and (name not in MODELS or MODELS[name].images_only):
        raise UserError(f"`model` {name} needs images (C, H, W); this data has {input_shape[0]} features "
                        "per sample: use `model` mlp")
    return name


def get_model(name="lenet", outputs=10, channels=1, members=1, fused=False):
    """A fresh, uninitialized network by name (:data:`MODELS` or gluoncv's zoo); ``members
    > 1``: the fused ensemble of that many members (EnsembleLeNet, else FusedMembers).
    ``fused``: LeNet (or its ensemble) with the fused conv operator (other networks ignore it). Zoo networks pool globally with
    a mean (``blocks.use_mean_pooling``)."""
    check_model_name(name)
    if members > 1:
        if name != "lenet":
            from .fused_members import FusedMembers
            return FusedMembers(lambda: get_model(name, outputs, channels), members)
        from .fused_lenet import EnsembleLeNet
        return EnsembleLeNet(members, fused, channels, outputs)
    if name in MODELS:
        return MODELS[name].build(outputs, channels, fused)
    from gluoncv import model_zoo
    try:
        net = model_zoo.get_model(ALIASES.get(name, name), classes=outputs)
    except (TypeError, ValueError) as e:
        raise UserError(f"model {name} cannot be built as a classifier of {outputs} outputs: {e}") from None
    use_mean_pooling(net)  # the same network, without oneDNN's slow path (blocks.py)
    return net
