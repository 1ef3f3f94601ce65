"""The plan line a run prints before it trains: what runs where, how the gradients are
exchanged, who gets each batch, the data and the run folder."""
from ..core.platform.devices import describe, thread_settings
from ..core.state.version import __version__
from ..core.step.kvstores import default_kvstore
from ..core.step.precision import bfloat16_class, bfloat16_measured, bfloat16_warning, measured_words
from ..models.fused_conv import is_fused
from ..models.init import ensemble_layout
from .recipes import spelled


def exchange_plan(dp, config, ctx):
    """'kvstore local, gradient buckets <= 4 MiB': how the gradients are exchanged."""
    if dp.spread:
        mine = sum(dp.owner.mine(k) for k in range(dp.owner.members))
        return (f"members spread over {dp.num_workers} worker{'s' * (dp.num_workers > 1)} ({mine} on this one), "
                "no gradient exchange, "
                "shared at each epoch's end")
    if dp.owner:
        return "no gradient exchange (independent members)"
    kvstore = f"kvstore {config.kvstore or default_kvstore(ctx)}"
    if len(dp.ctx) == 1 and dp.num_workers == 1:
        return kvstore
    return kvstore + (f", gradient buckets <= {config.bucket_mb:g} MiB" if dp.bucketing else ", a key per parameter")


def cpu_threads(ctx):
    """' (1 OpenMP thread per op, 1 engine worker per context)' for CPU devices."""
    if ctx[0].device_type != "cpu":
        return ""
    t = thread_settings()
    return (f" ({t['omp_threads']} OpenMP thread{'s' * (t['omp_threads'] > 1)} per op, "
            f"{t['engine_threads']} engine worker{'s' * (t['engine_threads'] > 1)} per context)")


def plan_line(config, run, ctx, out, dry_run=False):
    """One line: version | model on devices (threads) | exchange | batch | data | out."""
    dp = run.dp
    what = config.model
    members = len(run.sweep) or config.ensemble
    if members > 1:
        layout = ensemble_layout(config.ensemble_layout, config.model, ctx)
        what = f"{'sweep of ' if run.sweep else ''}{members} x {what} ({layout} layout)"
    if run.sweep and config.prune != "off":
        what += f", prune {config.prune} from epoch {config.prune_warmup}"
    what += " (fused conv+relu+pool)" if is_fused(dp.net) else ""
    what += f" in {dp.precision.describe()}" if dp.precision.dtype != "float32" else ""
    what += bfloat16_note(config, dp.precision)
    workers = f" x {dp.num_workers} workers" if dp.num_workers > 1 else ""
    spec = run.data.spec
    task = (f"{len(spec.classes)} classes" if spec.task == "classify" else f"regression of {spec.outputs}")
    augment = ((f", augment {run.augment}" if run.augment else "") + (f", {run.mixing}" if run.mixing else "")
               + (f", ema {config.ema:g}" if config.ema else "") + (f", validated with tta {config.tta}" if config.tta
                                                                    else ""))
    recipe = f"recipe {config.recipe}: {spelled(config)} | " if config.recipe else ""
    dry = " (dry run: not created)" if dry_run else ""
    return (f"gluon_gpu {__version__} | {what} on {describe(ctx)}{workers}{cpu_threads(ctx)} | "
            f"{exchange_plan(dp, config, ctx)} | batch {config.batch_size} "
            f"({batch_plan(dp, run.train, config.batch_size, ctx)}) | "
            f"{spec.dataset} "
            f"{'x'.join(map(str, spec.input_shape))}, {task}, {run.train.n} samples ({run.val.n} to validate) "
            f"from {spec.source}, {run.pipeline}{augment} | {recipe}out {out}{dry}")


def batch_plan(dp, pipeline, batch_size, ctx):
    """Who gets each batch, for the plan line."""
    if not dp.owner:
        return f"{batch_size // len(ctx)}+ per device"
    return "whole, to each member in turn" if pipeline.turns > 1 else "whole, to every member"


def bfloat16_note(config, precision):
    """What the plan line says of a bfloat16 run's kernels: the figures measured on this
    CPU's class (never another's), and why ``auto`` chose as it did."""
    if precision.dtype != "bfloat16":
        return ""
    measured = bfloat16_measured()
    warning = bfloat16_warning(measured) if not precision.kernels else ""
    if warning:
        return f" ({warning})"
    if not measured:
        return f" (not measured on a CPU with {bfloat16_class()}: scripts/bfloat16_page.py measures it)"
    figures = f"{measured.get('model', 'ResNet-20')} trains at contrib.amp {float(measured['amp']):.2f}x float32" + (
        f", oneDNN 3 {float(measured['onednn']):.2f}x" if "onednn" in measured else "")
    chosen = ""
    if config.bfloat16_kernels == "auto" and "onednn" in measured:  # the table says which is faster for ResNet-20
        chosen = ("auto chose the faster: " if precision.kernels else
                  "auto: contrib.amp, as oneDNN 3's kernels run a CIFAR ResNet v1's features, not this network; ")
    return f" ({chosen}{figures}, {measured_words(measured)})"
