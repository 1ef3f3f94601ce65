"""Assembling a run from a :class:`RunConfig`: data, network, pipelines and the
DataParallel step. Shared by train (and --resume) and bench."""
import re
from dataclasses import dataclass, fields, replace
from typing import NamedTuple, Optional


from ..core.loop.ema import WeightAverage
from ..core.platform.devices import default_workers
from ..core.platform.errors import UserError
from ..core.step.heads import head_for
from ..core.step.kvstores import check_options, create_store, is_distributed
from ..core.step.parallel import DataParallel
from ..core.step.precision import check_precision, precision_for
from ..core.step.tta import check_tta, parse_tta
from ..core.step.spread_members import owners
from ..data import Dataset, DataSpec, load_dataset, make_pipeline
from ..data.augment import describe, gathers, make_augment, parse_augment
from ..data.batch_order import member_seeds, shared_batches
from ..data.device_pipeline import MIXED_MEMBERS_AUGMENTED, device_copy_bytes
from ..data.mixing import describe as describe_mixing, make_mixing
from ..data.pipelines import choose_pipeline, device_only
from ..models import amx_features, init_model
from ..models.fused_conv import compiled_gather
from ..models.member_stack import pipeline_layout
from ..models.sync_bn import use_sync_batchnorm
from ..models.zoo import check_model_name, model_for
from .cli import MAX_SEED, check_batch
from .config import RunConfig
from .sweep import check_sweep, member_configs, per_member


@dataclass
class Run:
    config: RunConfig  # with the model 'auto' resolved
    dp: DataParallel
    train: object
    val: object
    data: Dataset
    warnings: tuple = ()  # one line each, for the person starting the run
    pipeline: str = ""  # the input pipeline, and why when --pipeline auto chose it
    augment: str = ""  # the augmentation, every parameter written out ("" for none)
    mixing: str = ""  # mixup or cutmix, its alpha and last epoch ("" for none)
    ema: object = None  # --ema: the WeightAverage of the weights
    sweep: tuple = ()  # --sweep: each member's RunConfig


def build_run(config: RunConfig, ctx, exchange=True, data=None, model=None, saved_spec=None, pipelines=None):
    """Data, network and DataParallel for ``config`` on ``ctx``.

    ``data``: a loaded :class:`Dataset` (default: ``config``'s dataset); ``model``: a
    user's Block instead of ``config.model``. ``saved_spec``: the spec a resumed run
    recorded; the data must match it. With a distributed kvstore each worker trains on
    its shard of every global batch (``--batch-size`` is per worker). ``exchange=False``:
    the benchmark's baseline without the gradient exchange; ``pipelines``: another run's
    ``(train, val)`` to share (the benchmark's, so its data is decoded and held once)."""
    sweep = _check_config(config, ctx, model)
    members = _members(config, sweep)
    data = data or load_dataset(config.dataset, config.data_dir, config.image_size, config.task, config.limit,
                                config.val_limit, decoded=False)  # decoded below if the device pipeline keeps it
    spec = data.spec
    if saved_spec is not None:
        DataSpec.from_dict(saved_spec).check_same_data(spec, f"the data ({spec.source})")
        spec = DataSpec.from_dict(saved_spec)  # the run's normalization, not a recomputed one
    if model is None:
        config = replace(config, model=model_for(config.model, spec.input_shape))
    check_tta(parse_tta(config.tta), spec.input_shape, spec.task)
    store = create_store(config.kvstore) if is_distributed(config.kvstore) else None
    spread = spread_over(store, members, config.ensemble_layout)
    shard = (store.rank, store.num_workers) if store and not spread else (0, 1)
    net = _network(config, ctx, model, data, spec, sweep, spread)
    inputs = _training_inputs(config, sweep, spec, members, ctx)
    layout = pipeline_layout(net, ctx)
    synced = use_sync_batchnorm(net, len(ctx)) if config.sync_bn else 0
    if config.sync_bn:
        _check_sync_bn_batches(len(data.train_y), config.batch_size * shard[1], len(ctx))
    pipes, described = _pipelines(config, ctx, data, layout, sweep, inputs, shard, pipelines)
    dp = _step(config, ctx, net, store, spec, sweep, inputs, exchange, pipes[0], spread is not None)
    return Run(config, dp, pipes[0], pipes[1], Dataset(data.train_x, data.train_y, data.val_x, data.val_y, spec),
               _warnings(config, synced, shard[1], data), described,
               describe(inputs.augment.components) if inputs.augment is not None else "",
               describe_mixing(inputs.mixing, inputs.mix_alphas) if inputs.mixing is not None else "",
               WeightAverage(dp, config.ema, pipes[1]) if config.ema else None, sweep)


def _members(config, sweep):
    """The members a run trains at once (sweep.member_count, from its parsed ``sweep``)."""
    return len(sweep) or config.ensemble


def _check_config(config, ctx, model):
    """Refuse what ``config`` cannot run before any data is read; its sweep's members."""
    check_batch(config.batch_size, ctx)
    check_options(ctx, config.kvstore)
    check_precision(precision_for(config.dtype, config.amp), ctx)
    if model is None and config.model != "auto":
        check_model_name(config.model)
    sweep = member_configs(config)
    check_sweep(config, sweep)
    members = _members(config, sweep)
    if config.sync_bn and members > 1 and config.ensemble_layout != "fused":
        raise UserError(f"`sync_bn`: with `ensemble_layout` {config.ensemble_layout} every member trains on whole "
                        "batches on one device, so its BatchNorm has nothing to synchronize; leave `sync_bn` out")
    if config.seed + config.ensemble - 1 > MAX_SEED:
        raise UserError(f"`seed` {config.seed} with `ensemble` {config.ensemble}: member seeds pass {MAX_SEED}")
    if config.ema and members > 1:
        raise UserError("`ema` does not apply to an `ensemble` or a `sweep` yet")
    if config.tta and members > 1:
        raise UserError("`tta` validates one network, not an `ensemble` or a `sweep`")
    judges = [flag for flag, on in (("early_stop", config.early_stop), ("prune", config.prune != "off")) if on]
    if config.val_every > 1 and judges:
        raise UserError(f"`val_every` {config.val_every}: `{judges[0]}` judges every epoch's validation; validate "
                        "every epoch (`val_every` 1) to use it")
    return sweep


def _network(config, ctx, model, data, spec, sweep, spread):
    """The network (``model``, else ``config.model``) made and initialized on ``ctx``."""
    members = _members(config, sweep)
    # --fused-conv also chooses the augmentation's compiled gather: "on" asks it of the
    # model only where the gather does not take it (make_augment checks the gather's)
    fused = "auto" if config.fused_conv == "on" and gathers(parse_augment(config.augment)) \
        and (model or config.model) != "lenet" \
        else config.fused_conv
    net = init_model(model or config.model, config.seed, ctx, spec.input_shape, spec.outputs, members,
                     fused, config.ensemble_layout, config.hybridize,
                     min(config.batch_size, len(data.train_y)),  # the largest batch the data makes
                     [m.seed for m in sweep] or None, [m.label_smoothing for m in sweep] or None, spread)
    if any(m.label_smoothing for m in sweep or [config]) and spec.task != "classify":
        raise UserError(f"`label_smoothing` applies to classification; this data is task {spec.task}")
    if config.no_wd:
        exclude_from_weight_decay(net)
    if config.dtype != "bfloat16":
        return net
    return amx_features.choose(net, config.bfloat16_kernels, ctx, members, config.sync_bn)


class RunInputs(NamedTuple):
    """What a run feeds its step besides the samples."""
    augment: object  # the Augment block, or None
    mixing: object  # the Mixing block, or None
    mix_alphas: Optional[list]  # a sweep's members' alphas


def _training_inputs(config, sweep, spec, members, ctx):
    augment = make_augment(config.augment, spec, lambda: compiled_gather(config.fused_conv, ctx))
    mixing, mix_alphas = members_mixing(config, sweep, spec)
    if augment is not None and members > 1 and mixing is not None:
        raise UserError(MIXED_MEMBERS_AUGMENTED)
    return RunInputs(augment, mixing, mix_alphas)


def _pipelines(config, ctx, data, layout, sweep, inputs, shard, shared_pipes=None):
    """``((train, val) pipelines, their description for the plan line)``; ``shared_pipes``:
    another run's, used instead."""
    members, seeds = _members(config, sweep), [m.seed for m in sweep] or None
    shared = shared_batches(members, member_seeds(config.seed, members, seeds), inputs.mixing)  # one read for all
    pipeline, why = choose_pipeline(config.pipeline, sum(device_copy_bytes(x, y) for x, y in (
        (data.train_x, data.train_y), (data.val_x, data.val_y))), layout.train_ctx,
        device_only(members, shared), data.on_disk)
    workers = default_workers(ctx) if config.loader_workers is None else config.loader_workers
    pipes = shared_pipes or [make_pipeline(pipeline, x, y, config.batch_size, pipe_ctx, config.seed, shuffle=train,
                           num_workers=workers, members=members, shard=shard if train else (0, 1), seeds=seeds,
                           member_groups=layout.member_groups if train else None,
                           in_turns=train and layout.in_turns, augment=inputs.augment if train else None,
                           mixing=inputs.mixing if train else None, mix_alphas=inputs.mix_alphas)
             for x, y, train, pipe_ctx in ((data.train_x, data.train_y, True, layout.train_ctx),
                                           (data.val_x, data.val_y, False, layout.eval_ctx))]
    return pipes, f"pipeline {pipeline}" + (f" ({why})" if why else "") + _workers_text(
        workers, pipeline == "loader" or data.on_disk)


def _step(config, ctx, net, store, spec, sweep, inputs, exchange, train, spread):
    """The DataParallel step. A sweep: each member its own optimizer and loss; members
    ``spread`` over workers: their own optimizers (update counts by parameter, whatever
    the device: core/step/member_optimizer.py)."""
    members = _members(config, sweep)
    updates_per_epoch = -(-len(train) // train.turns // config.accumulate)  # each member's, in turns too
    params = per_member(sweep or [config] * members, lambda m: optimizer_params(m, updates_per_epoch)) \
        if sweep or spread else optimizer_params(config, updates_per_epoch)
    head = per_member(sweep, lambda m: head_for(spec.task, spec.outputs, m.label_smoothing)) if sweep else \
        head_for(spec.task, spec.outputs, config.label_smoothing)
    return DataParallel(net, ctx, config.optimizer, params, kvstore=store or config.kvstore, head=head,
                        transform=spec.transform(members), hybridize=config.hybridize, dtype=config.dtype,
                        amp=config.amp, batch_size=config.batch_size, bucket_bytes=int(config.bucket_mb * 2**20),
                        exchange=exchange, accumulate=config.accumulate, clip_grad=config.clip_grad,
                        augment=inputs.augment, mixing=inputs.mixing, tta=config.tta or None)


def _warnings(config, synced, workers, data):
    """One line each, for the person starting the run."""
    samples, warnings = len(data.train_y), idle_flags(config)
    for flag, limit, held, which in (("limit", config.limit, samples, "training"),
                                     ("val_limit", config.val_limit, len(data.val_y), "validation")):
        if limit and limit > held:  # --limit 100000 on 90 images trained on 90, without a word
            warnings.append(f"`{flag}` {limit} is more than the {held} {which} samples the data has: it uses them all")
    if config.sync_bn and not synced:
        warnings.append(f"`sync_bn`: {config.model} has no BatchNorm layer; nothing to synchronize")
    if config.batch_size * workers > samples:
        warnings.append(f"`batch_size` {config.batch_size * workers} is larger than the {samples} "
                        f"training samples: every epoch is one update of {samples} samples")
    return tuple(warnings)


def spread_over(store, members, layout):
    """``(owners, rank)`` when ``members`` (an ensemble or sweep) are spread over the
    workers of a distributed job (core/step/spread_members.py), else None. The fused layout
    is one network: it trains data-parallel over the workers instead."""
    if store is None or members < 2 or layout == "fused":
        return None
    if members < store.num_workers:
        raise UserError(f"{members} members over {store.num_workers} workers: each worker trains whole members, "
                        f"so give {store.num_workers} or more (`ensemble` or `sweep`), or launch fewer workers")
    return owners(members, store.num_workers), store.rank


def _workers_text(workers, used):
    if not used:
        return ""
    return f", {workers} data worker{'s' if workers != 1 else ''}" if workers else ", data read in this process"


NO_DECAY = re.compile(r".*(bias|gamma|beta)$")  # GluonCV's --no-wd: biases and BatchNorm's scale and shift


def exclude_from_weight_decay(net):
    """``--no-wd``: weight decay multiplier 0 for ``net``'s biases and BatchNorm gammas
    and betas (set before the Trainer reads it)."""
    for name, param in net.collect_params().items():
        if NO_DECAY.match(name):
            param.wd_mult = 0.0


def members_mixing(config, sweep, spec):
    """``(the Mixing block, each member's alpha or None)``: a sweep's members mix alike
    (all or none, the same kind), each with its own alpha; others as their flags say."""
    if not sweep:
        return make_mixing(config.mixup, config.cutmix, config.mixup_off_epochs, config.epochs, spec), None
    blocks = per_member(sweep, lambda m: make_mixing(m.mixup, m.cutmix, m.mixup_off_epochs, m.epochs, spec))
    kinds = {block.kind if block else "none" for block in blocks}
    if len(kinds) > 1:
        raise UserError(f"`sweep`: every member mixes its samples the same way or none does; these members would "
                        f"mix by {', '.join(sorted(kinds))}")
    return blocks[0], [block.alpha for block in blocks] if blocks[0] else None


def _check_sync_bn_batches(samples, global_batch, devices):
    """SyncBatchNorm waits for every device at each layer: a last batch too small to
    give each device a sample would wait forever."""
    last = samples % global_batch
    if 0 < last < devices:
        raise UserError(f"`sync_bn`: the last batch of each epoch would hold {last} sample(s) for {devices} "
                        "devices, and SyncBatchNorm needs a sample on every device; change `batch_size` or `limit`")


def optimizer_params(config, iters_per_epoch):
    """The optimizer's parameters; ``iters_per_epoch`` counts updates (batches / ``accumulate``)."""
    params = {"wd": config.wd}
    if not 0 <= config.momentum < 1:  # the flag's type says so too (cli.below_one)
        raise UserError(f"`momentum` {config.momentum}: must be from 0 to below 1, where SGD converges")
    if config.optimizer in ("sgd", "nag"):
        params["momentum"] = config.momentum
    elif config.momentum:
        raise UserError(f"`momentum` applies to sgd and nag, not {config.optimizer}")
    scheduler = lr_scheduler(config, iters_per_epoch)
    # A schedule holds the rate itself: given a learning_rate as well, MXNet prints a
    # warning on every run whose schedule starts elsewhere (warmup from --warmup-lr).
    params.update({"lr_scheduler": scheduler} if scheduler is not None else {"learning_rate": config.lr})
    return params


# The one rule for flags that change something only in some modes (argparse takes any
# flag silently): (flag, the flag that chooses its mode, whether this run's mode leaves
# it idle, what it does). A flag set away from its default in an idle mode is a warning.
IDLE_FLAGS = (
    ("lr_decay_epoch", "lr_mode", lambda c: c.lr_mode != "step", "it sets the decay epochs of `lr_mode` step"),
    ("lr_decay", "lr_mode", lambda c: c.lr_mode != "step", "it is the factor at each decay epoch of `lr_mode` step"),
    ("warmup_lr", "warmup_epochs", lambda c: not c.warmup_epochs, "it is the rate a warmup starts from"),
    ("prune_warmup", "prune", lambda c: c.prune == "off", "it is how long a member trains before `prune` judges it"),
    ("bfloat16_kernels", "dtype", lambda c: c.dtype != "bfloat16", "it chooses the kernels of `dtype` bfloat16"),
    ("ensemble_layout", "ensemble", lambda c: c.ensemble == 1 and not c.sweep,
     "it lays out the members of an `ensemble` or a `sweep`"),
    ("commit_steps", "kvstore", lambda c: c.kvstore != "horovod", "it is how often an elastic Horovod job commits"),
    ("max_resets", "kvstore", lambda c: c.kvstore != "horovod", "it bounds an elastic Horovod job's resets"),
)


def idle_flags(config):
    """A warning for each flag set away from its default that changes nothing in the
    mode chosen (:data:`IDLE_FLAGS`), and for decay epochs past the last epoch. A sweep
    that varies the mode that uses one is left alone."""
    varied = (config.sweep or "").replace("_", "-")
    defaults = {f.name: f.default for f in fields(RunConfig)}
    said = [f"`{flag}` {getattr(config, flag)} changes nothing with `{mode}` {getattr(config, mode)} ({why})"
            for flag, mode, idle, why in IDLE_FLAGS
            if idle(config) and getattr(config, flag) != defaults[flag] and mode.replace("_", "-") not in varied]
    late = [e for e in map(int, filter(None, config.lr_decay_epoch.split(","))) if e > config.epochs]
    if late and config.lr_mode == "step":
        said.append(f"`lr_decay_epoch` {','.join(map(str, late))} comes after the last epoch (`epochs` "
                    f"{config.epochs}): this run never decays there")
    return said


def lr_scheduler(config, iters_per_epoch):
    """gluoncv's schedulers, stepped per update: ``warmup_epochs`` of linear warmup from
    ``--warmup-lr`` (reaching ``--lr`` at its last update), then ``--lr-mode`` over the
    remaining epochs (step decays at the absolute ``--lr-decay-epoch``), as GluonCV's
    training scripts compose them with ``LRSequential``. None: a constant rate."""
    warmup = config.warmup_epochs
    if warmup and warmup >= config.epochs:  # typed: a recipe's own warm-up leaves an epoch (recipes.apply_recipe)
        raise UserError(f"`warmup_epochs` {warmup} leaves no epoch of training after it (`epochs` "
                        f"{config.epochs}): give more `epochs`, or `warmup_epochs` 0")
    if warmup and warmup * iters_per_epoch < 2:
        raise UserError(f"`warmup_epochs` {warmup} is {warmup * iters_per_epoch} update: warmup needs 2 or more")
    if config.lr_mode == "constant" and not warmup:
        return None
    from gluoncv.utils import LRScheduler, LRSequential
    if (config.epochs - warmup) * iters_per_epoch < 2:
        raise UserError(f"`lr_mode` {config.lr_mode} needs at least 2 updates (epochs x batches)")
    steps = _decay_epochs(config)
    # gluoncv clamps the update count to its last iteration, niters - 1, but MXNet
    # counts updates from 1: the last step of a run ending at a decay epoch missed the
    # decay, unlike the same step of a longer run (a resume with more --epochs).
    # A step schedule is shaped by its decay epochs alone: lay it out past them.
    nepochs = max([config.epochs] + steps) + 1 if steps else config.epochs
    # 'constant' is gluoncv's 'step' with no decay (its own 'constant' gives target_lr, 0)
    main = LRScheduler("step" if config.lr_mode == "constant" else config.lr_mode, base_lr=config.lr,
                       nepochs=nepochs - warmup, iters_per_epoch=iters_per_epoch,
                       step_epoch=[s - warmup for s in steps or []], step_factor=config.lr_decay)
    if not warmup:
        return main
    return LRSequential([LRScheduler("linear", base_lr=config.warmup_lr, target_lr=config.lr, nepochs=warmup,
                                     iters_per_epoch=iters_per_epoch), main])


def _decay_epochs(config):
    """``lr_decay_epoch`` as epochs (cli.epoch_list checked the text) for ``lr_mode``
    step, else None (another mode ignores it: build_run warns)."""
    if config.lr_mode != "step":
        return None
    if not config.lr_decay_epoch:
        raise UserError("`lr_mode` step needs `lr_decay_epoch`, e.g. 6,8")
    return [int(e) for e in config.lr_decay_epoch.split(",")]
