"""Recipes (``--recipe NAME``): named bundles of training flags kept with the package,
each with the result it was measured to reach. The user's own flags override any part
of a recipe; the plan line prints the recipe as applied. ``--recipe list`` shows them.

A recipe's figure is a measurement of one run (seed 0, the full FashionMNIST test set)
on the date named; docs/accuracy.md says how it was measured and how long it took.
"""
import re
from collections import namedtuple
from dataclasses import replace
from typing import NamedTuple

from ..core.platform.errors import UserError
from ..core.step import precision
from .config import flag_name

Recipe = namedtuple("Recipe", "flags what measured")


class ByCpu(NamedTuple):
    """A recipe's value that depends on the CPU: ``bfloat16`` where it has AVX-512 BF16 or
    AMX, ``other`` elsewhere (``--dtype``: the fastest precision each CPU trains in)."""
    bfloat16: object
    other: object

    def value(self):
        return self.bfloat16 if precision.has_bfloat16() else self.other

    def __str__(self):
        return f"{_value_text(self.bfloat16)} (on CPUs with AVX-512 BF16 or AMX; else {_value_text(self.other)})"


def _resolved(value):
    return value.value() if isinstance(value, ByCpu) else value

RECIPES = {
    "lenet": Recipe(
        {"model": "lenet", "epochs": 10, "batch_size": 256, "lr": 0.2, "momentum": 0.9, "wd": 5e-4, "no_wd": True,
         "lr_mode": "cosine", "warmup_epochs": 1, "label_smoothing": 0.1},
        "the tutorial's LeNet and epochs with momentum, cosine decay, weight decay and label smoothing",
        "val-acc 0.9102 after 10 epochs on the 10,000 test images, seed 0, "
        "cpu*2, 2026-12-04"),
    "resnet20": Recipe(
        {"model": "cifar_resnet20_v1", "epochs": 60, "batch_size": 128, "lr": 0.1, "momentum": 0.9, "wd": 5e-4,
         "no_wd": True, "lr_mode": "cosine", "warmup_epochs": 2, "label_smoothing": 0.1,
         "augment": "flip,crop=2,erase=0.5", "ema": 0.999},
        "GluonCV's CIFAR ResNet-20 with flips, 2-pixel crops, random erasing, label smoothing, cosine decay and "
        "a moving average of the weights",
        "val-acc 0.9503 after 60 epochs with the averaged weights (best.params; the raw weights 0.9494; Zalando's "
        "table: ResNet18 0.949) on the 10,000 test images, seed 0, cpu*2, a median epoch of 78 s, 2026-12-04"),
    "fast94": Recipe(
        {"model": "cifar_resnet20_v1", "epochs": 12, "batch_size": 128, "optimizer": "nag", "lr": 0.1,
         "momentum": 0.9, "wd": 5e-4, "no_wd": True, "lr_mode": "cosine", "warmup_epochs": 1,
         "label_smoothing": 0.1, "augment": "flip,crop=2", "tta": "flip", "dtype": ByCpu("bfloat16", "float32")},
        "the soonest val-acc 0.94: ResNet-20 for 12 epochs, nesterov with one warm-up epoch then cosine decay, "
        "flips and 2-pixel crops, label smoothing, validated on each image and its mirror (tta), in bfloat16 "
        "where the CPU has it",
        "val-acc 0.9436 (validated on each image and its mirror) at epoch 11 on the 10,000 test images, 552 s of "
        "training and validation, seed 0, cpu*2 in bfloat16 on an AMD EPYC (AVX-512 BF16), 2026-12-07; over 5 "
        "seeds 0.9413 at epoch 12 (docs/speedrun.md)"),
}


def apply_recipe(config, given):
    """``config`` with its recipe's flags, except those the user gave (``given``: the
    names typed on the command line)."""
    if not config.recipe:
        return config
    if config.recipe not in RECIPES:
        raise UserError(f"unknown `recipe` {config.recipe!r}: choose one of {', '.join(RECIPES)}, or list")
    config = replace(config, **{name: _resolved(value) for name, value in RECIPES[config.recipe].flags.items()
                                if name not in given})
    if "warmup_epochs" not in given and config.warmup_epochs >= config.epochs:
        # a short try of a recipe (--epochs 1) keeps an epoch after the warm-up: the plan line says so
        config = replace(config, warmup_epochs=config.epochs - 1)
    return config


def blamed(error, config, typed):
    """``error`` (a UserError about ``config``), its line saying which of the flags it
    names the recipe set, not the user (``typed``): `--recipe fast94 --ensemble 2` said
    "--tta validates one network", a --tta the user never typed."""
    if not config.recipe or config.recipe not in RECIPES:
        return error
    flags = RECIPES[config.recipe].flags
    named = [n for n in dict.fromkeys(re.findall(r"`([a-z0-9_]+)`", str(error))) if n in flags and n not in typed]
    if not named:
        return error
    said = ", ".join(_flag_text(n, getattr(config, n)).replace(flag_name(n), f"`{n}`", 1) for n in named)
    error.args = (f"{error} ({said}: set by recipe {config.recipe}; a flag typed beside it overrides it)",)
    return error


def spelled(config):
    """The recipe as the run applies it, in flags, a changed one with the recipe's own
    value: ``--lr 0.1 --epochs 3 (recipe: 10) ...``."""
    parts = []
    for name, value in RECIPES[config.recipe].flags.items():
        mine = getattr(config, name)
        value = _resolved(value)
        parts.append(_flag_text(name, mine) + (f" (recipe: {_value_text(value)})" if mine != value else ""))
    return " ".join(parts)


def _value_text(value):
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flag_text(name, value):
    if isinstance(value, bool):
        return flag_name(name) if value else f"no {flag_name(name)}"
    return f"{flag_name(name)} {_value_text(value)}"


def recipe_table():
    """``--recipe list``: each recipe, its flags, and what it reached."""
    lines = []
    for name, recipe in RECIPES.items():
        lines += [f"{name}: {recipe.what}", "    " + " ".join(_flag_text(k, v) for k, v in recipe.flags.items()),
                  f"    measured: {recipe.measured}"]
    return "\n".join(lines)
