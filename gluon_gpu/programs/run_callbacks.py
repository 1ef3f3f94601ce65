"""The callbacks a training run gets from its configuration: the epoch line,
metrics.json, curves.png, metrics.csv, best.params, TensorBoard, the profiler and early
stopping."""
import os

from ..core.loop.callbacks import CurvesPlot, EpochPrinter, GuessingWatch, MetricsFile
from ..core.loop.early_stopping import BestParams, EarlyStopping, Monitor
from ..core.loop.loggers import MetricsCsv, TensorBoard
from ..core.loop.profiling import StepProfiler
from ..core.loop.pruning import Pruning
from .sweep import member_count
from .sweep_results import SweepRecord, SweepTable, sweep_monitor

DEFAULT_MONITOR = {"classify": "val-acc", "regress": "val-mse"}


def monitor_for(config, run):
    """The run's --monitor (auto: by task), checked against the figures it reports."""
    flag = DEFAULT_MONITOR[run.data.spec.task] if config.monitor == "auto" else config.monitor
    return sweep_monitor(flag, run.dp.names, run.sweep) if run.sweep else Monitor(flag, run.dp.names)


def early_stopping(config, monitor):
    return EarlyStopping(monitor, config.early_stop) if config.early_stop else None


def chief_callbacks(config, run, out, header, monitor, say=print, resumed_at=None, history=()):
    """What rank 0 (the only writer) runs at each epoch end, in order; ``say`` shows the
    epoch line (the run's TrainLog). ``history``: a resumed run's epochs so far."""
    callbacks = [run.ema] if run.ema is not None else []  # first: its figures join the epoch's record
    table = SweepTable(out, run.sweep, monitor) if run.sweep else None
    if run.sweep:  # first too: they shape the record the others write
        callbacks.append(SweepRecord())
        if config.prune != "off":
            pruning = Pruning(config.prune, monitor.key, monitor.lower, config.prune_warmup, run.dp.net.stop)
            pruning.resume(history)
            callbacks.append(pruning)
    callbacks.append(EpochPrinter(config.epochs, say))
    if run.data.spec.task == "classify" and member_count(config) == 1:  # members sum their losses
        callbacks.append(GuessingWatch(run.data.class_counts(), config.lr, say))
    callbacks += [BestParams(os.path.join(out, "best.params"), run.dp.net, monitor, run.ema),
                  MetricsFile(os.path.join(out, "metrics.json"), header,
                              extra=lambda history: {"best": monitor.summary(history),
                                                     **({"sweep": table.rows(history)} if table else {})}),
                  MetricsCsv(os.path.join(out, "metrics.csv"), config.log_steps, resumed_at),
                  CurvesPlot(os.path.join(out, "curves.png"))]
    if table:
        callbacks.append(table)
    if config.tensorboard:
        callbacks.append(TensorBoard(os.path.join(out, "tb"), config.log_steps))
    if config.profile:
        callbacks.append(StepProfiler(out, config.profile))
    stopper = early_stopping(config, monitor)
    return callbacks + ([stopper] if stopper else [])
