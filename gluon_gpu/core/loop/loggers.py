"""Logs a person browses: ``metrics.csv`` (a spreadsheet row per epoch, and per log
interval with ``log_steps``) and TensorBoard event files (tensorboardX). Callbacks like
those of callbacks.py, plus ``on_log(step_record)`` at the loop's sync points."""
import csv
import io
import os
import sys

from ..platform.errors import UserError, WriteError
from ..platform.files import write_text
from .callbacks import Callback

POSITION = ("kind", "epoch", "batch", "step")


def _flat(record):
    """A record's scalars, member lists spread out as ``member_val_acc_3``."""
    flat = {}
    for key, value in record.items():
        if isinstance(value, list):
            flat.update({f"{key}_{k}": v for k, v in enumerate(value)})
        elif isinstance(value, (int, float)):
            flat[key] = value
    return flat


class MetricsCsv(Callback):
    """``RUN/metrics.csv``, rewritten atomically at every epoch end: one row per epoch
    (``kind`` epoch), and with ``log_steps`` one per log interval (``kind`` step) before
    them. Step rows of earlier processes of a resumed run are kept up to where it resumed."""

    def __init__(self, path, log_steps, resumed_at=None):
        """``resumed_at``: ``(epoch index, batch)`` a resumed run goes on from."""
        self.path, self.log_steps = path, log_steps
        self.steps = self._earlier_steps(resumed_at) if log_steps and resumed_at else []

    def _earlier_steps(self, resumed_at):
        try:
            with open(self.path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if r.get("kind") == "step"]
        except OSError:
            return []
        until = (resumed_at[0] + 1, resumed_at[1])  # rows number epochs from 1
        kept = [r for r in rows if (int(r["epoch"]), int(r["batch"])) <= until]
        return [{k: v if k == "kind" or v == "" else int(v) if k in POSITION else float(v) for k, v in r.items()}
                for r in kept]

    def on_log(self, step_record):
        if self.log_steps:
            self.steps.append({"kind": "step", **_flat(step_record)})

    def on_epoch_end(self, record, history):
        self.write(history)

    def on_train_end(self, history, status, reason=None):
        self.write(history)

    def write(self, history):
        rows = self.steps + [{"kind": "epoch", **_flat(r)} for r in history]
        columns = list(POSITION)
        for row in rows:
            columns += [k for k in row if k not in columns]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, columns, restval="")
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["epoch"], r.get("batch") or float("inf"))))
        write_text(self.path, buffer.getvalue())


class TensorBoard(Callback):
    """``RUN/tb/`` event files: per epoch ``train/<metric>``, ``val/<metric>``, ``lr``,
    ``samples_per_s``, and per ensemble member ``member/<split>_<metric>/<k>``; per log
    interval (``log_steps``) ``step/train_<metric>`` at the global batch count."""

    def __init__(self, directory, log_steps):
        try:
            os.makedirs(directory, exist_ok=True)
            from tensorboardX import SummaryWriter
            self.writer = SummaryWriter(logdir=directory, flush_secs=10)
        except OSError as e:
            raise UserError(f"`tensorboard`: cannot write to {directory}: {e.strerror or e}") from None
        self.log_steps = log_steps

    def on_log(self, step_record):
        if self.log_steps:
            for key, value in step_record.items():
                if key.startswith("train_") and isinstance(value, (int, float)):
                    self.writer.add_scalar(f"step/{key}", value, step_record["step"])

    def on_epoch_end(self, record, history):
        epoch = record["epoch"]
        for key, value in record.items():
            if key.startswith(("train_", "val_")) and isinstance(value, (int, float)):
                split, name = key.split("_", 1)
                self.writer.add_scalar(f"{split}/{name}", value, epoch)
            elif key.startswith("member_") and isinstance(value, list):
                for k, v in enumerate(value):
                    if v is not None:  # a member that no longer trains
                        self.writer.add_scalar(f"member/{key[len('member_'):]}/{k}", v, epoch)
            elif key in ("lr", "samples_per_s"):
                self.writer.add_scalar(key, value, epoch)
        self.writer.flush()

    def on_train_end(self, history, status, reason=None):
        self.writer.close()


def show(line, stream=None):
    """Print ``line`` (to stdout, or ``stream``). A reader that went away (``train | head
    -3``) must not end the run: the stream then goes to /dev/null, and the run goes on,
    its lines in train.log."""
    stream = stream or sys.stdout
    try:
        print(line, file=stream, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


class TrainLog:
    """``RUN/train.log``: the lines a run shows a person (its plan, every epoch, stops, the
    end), appended as they are printed, so the run folder tells its story after the
    terminal is gone; a resumed run appends. ``log(line)`` prints and appends (``stream``:
    stderr for errors and warnings), ``record(line)`` only appends. ``header``: lines
    already printed (the plan) that go to the file before its first line, so a run that
    has nothing to do (a --resume of a finished run) leaves its folder untouched."""

    def __init__(self, path, header=()):
        self.path, self._header = path, list(header)

    def __call__(self, line, stream=None):
        show(line, stream)
        self.record(line)

    def record(self, line):
        lines, self._header = self._header + [line], []
        try:
            with open(self.path, "a") as f:
                f.write("".join(l + "\n" for l in lines))
        except OSError as e:
            raise WriteError(self.path, e.strerror or str(e)) from None
