"""--sweep and --sweep-random: the configurations of a hyperparameter sweep, trained at
once as the members of one job (HFTA's idea: trials that each leave the hardware idle
share it). Each member is a whole RunConfig, the one a run of its flags alone has, so
member k trains exactly as that run would.

A grid (every combination, the first axis slowest)::

    --sweep "lr=0.02,0.05,0.1 wd=0,1e-4"

Random search: ``--sweep-random N`` draws N configurations from ranges ``LO:HI``
(uniform), ``LO:HI:log`` (log-uniform) and lists (one value, uniformly), seeded by
``--seed``. A value of ``lr-decay-epoch`` lists its epochs with ``/`` (``6/8``).
"""
import argparse
import itertools
import math
from dataclasses import fields, replace

import numpy as np

from ..core.platform.errors import UserError
from .config import SWEEPABLE, RunConfig, flag_name

NOT_YET = {"optimizer": "every member has the same optimizer kind (its parameters may differ)"}
INTEGER = ("warmup_epochs", "seed")
_FIELDS = {f.name: f for f in fields(RunConfig)}


def member_configs(config):
    """The members of ``config``'s sweep as RunConfigs (``sweep`` cleared), or () for no
    sweep. Each member's own flags are checked here, naming the member."""
    if not config.sweep:
        if config.sweep_random:
            raise UserError("`sweep_random` draws from the ranges of `sweep`: give both")
        return ()
    axes = parse_axes(config.sweep)
    if config.ensemble > 1:
        raise UserError("`sweep` with `ensemble`: a sweep's members are its configurations; vary the seed with "
                        "seed=0,1,2 in `sweep`")
    if config.sweep_random:
        rng = np.random.default_rng(config.seed)
        chosen = [{name: draw(name, spec, rng) for name, spec in axes} for _ in range(config.sweep_random)]
    else:
        ranged = [name for name, spec in axes if isinstance(spec, tuple)]
        if ranged:
            raise UserError(f"`sweep` {flag_name(ranged[0])[2:]} is a range: give `sweep_random` N to draw N "
                            "configurations from it, or list its values")
        chosen = [dict(zip([n for n, _ in axes], values)) for values in itertools.product(*[s for _, s in axes])]
    if len(chosen) < 2:
        raise UserError(f"`sweep` {config.sweep!r} makes {len(chosen)} configuration: a sweep needs two or more")
    return tuple(replace(config, sweep="", sweep_random=None, **values) for values in chosen)


def member_count(config):
    """The members ``config`` trains at once: its sweep's configurations, else ``ensemble``."""
    return len(member_configs(config)) or config.ensemble


def check_sweep(config, members):
    """Refuse what a sweep of ``members`` (member_configs) cannot do, in one line."""
    if not members:
        if config.prune != "off":
            raise UserError(f"`prune` {config.prune} stops the members of a `sweep`; this run has none")
        return
    if config.ensemble_layout == "fused":
        raise UserError("`sweep` with `ensemble_layout` fused: fused members share each tensor, so they cannot "
                        "have learning rates of their own; use devices, separate or sequential")
    if config.early_stop:
        raise UserError("`early_stop` with `sweep`: members stop by `prune` (median or halving)")
    if config.prune != "off" and config.prune_warmup >= config.epochs:
        raise UserError(f"`prune_warmup` {config.prune_warmup} leaves no epoch before the last (`epochs` "
                        f"{config.epochs}) to judge the members at: `prune` {config.prune} would stop none")


def per_member(members, make):
    """``[make(member)]``, an error naming the member whose flags it refuses."""
    made = []
    for k, member in enumerate(members):
        try:
            made.append(make(member))
        except (UserError, ValueError) as e:
            raise UserError(f"`sweep` member {k} ({member_label(member, varied(members))}): {e}") from None
    return made


def member_label(member, varied):
    """'lr=0.05 wd=0.0001': the values of ``varied`` (names) that ``member`` has."""
    return " ".join(f"{flag_name(name)[2:]}={_shown(getattr(member, name))}" for name in varied)


def varied(members):
    """The names whose values differ between ``members``, in SWEEPABLE's order."""
    return [name for name in SWEEPABLE if len({getattr(m, name) for m in members}) > 1]


def parse_axes(text):
    """``[(name, [values] or (lo, hi, log))]`` of a --sweep text."""
    axes = []
    for item in text.split():
        key, sep, values = item.partition("=")
        name = key.replace("-", "_")
        if not sep or not values:
            raise UserError(f"`sweep` {item!r}: expected NAME=VALUES, e.g. lr=0.02,0.05")
        if name in NOT_YET:
            raise UserError(f"`sweep` cannot vary {key} yet: {NOT_YET[name]}")
        if name in _FIELDS and name not in SWEEPABLE:
            raise UserError(f"`sweep` cannot vary {key}: every member trains the same model on the same batches "
                            f"of the same data; a sweep varies {_names()}")
        if name not in SWEEPABLE:
            raise UserError(f"`sweep`: unknown hyperparameter {key!r}; a sweep varies {_names()}")
        if name in [n for n, _ in axes]:
            raise UserError(f"`sweep` names {key} twice")
        parts = values.split(":")
        if len(parts) > 1:
            axes.append((name, _range(name, key, parts)))
        else:
            listed = [_value(name, key, v) for v in values.split(",")]
            if len(set(listed)) < len(listed):  # lr=0.1,0.1 trained the same member twice
                raise UserError(f"`sweep` {item!r}: a value is given twice (as {key} takes it)")
            axes.append((name, listed))
    if not axes:
        raise UserError("`sweep` is empty: give NAME=VALUES, e.g. lr=0.02,0.05")
    return axes


def draw(name, spec, rng):
    """One value of axis ``name`` (its list, or range ``(lo, hi, log)``) from ``rng``."""
    if not isinstance(spec, tuple):
        return spec[rng.integers(len(spec))]
    lo, hi, log = spec
    if name in INTEGER:
        return int(rng.integers(lo, hi + 1))
    value = math.exp(rng.uniform(math.log(lo), math.log(hi))) if log else rng.uniform(lo, hi)
    return float(f"{value:.4g}")  # a value a person can type back as the flag


def _range(name, key, parts):
    if name not in [n for n, f in _FIELDS.items() if f.metadata.get("type")] or name == "lr_decay_epoch" \
            or len(parts) > 3 or (len(parts) == 3 and parts[2] != "log"):
        raise UserError(f"`sweep` {key}={':'.join(parts)}: a range is LO:HI or LO:HI:log, of a number")
    lo, hi = (_value(name, key, p) for p in parts[:2])
    log = len(parts) == 3
    if not lo < hi or (log and lo <= 0):
        raise UserError(f"`sweep` {key}={':'.join(parts)}: a range needs LO < HI{' and LO > 0 (log)' if log else ''}")
    return lo, hi, log


def _value(name, key, text):
    """``text`` as flag ``name`` takes it (the flag's own type and choices)."""
    meta = _FIELDS[name].metadata
    if name == "lr_decay_epoch":  # a sweep's values are comma-separated: 6/8 is one value
        text = text.replace("/", ",")
    try:
        value = meta["type"](text) if "type" in meta else text
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise UserError(f"`sweep` {key}={text}: {e}") from None
    if "choices" in meta and value not in meta["choices"]:
        raise UserError(f"`sweep` {key}={text}: choose from {', '.join(meta['choices'])}")
    return value


def _names():
    return ", ".join(flag_name(n)[2:] for n in SWEEPABLE)


def _shown(value):
    return value.replace(",", "/") if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else value
