"""Small, separate pieces that react to finished epochs: the log line, metrics.json, curves.png."""
import os

from .checkpoint import atomic_write, write_json


def format_epoch(record, epochs):
    """One human line per epoch."""
    return (f"epoch {record['epoch']:>3}/{epochs}  loss {record['train_loss']:.4f}  "
            f"train-acc {record['train_acc']:.4f}  val-acc {record['val_acc']:.4f}  "
            f"{record['seconds']:6.2f} s  {record['samples_per_s']:8.0f} samples/s")


class EpochPrinter:
    def __init__(self, epochs, write=print):
        self.epochs, self.write = epochs, write

    def on_epoch_end(self, record, history):
        self.write(format_epoch(record, self.epochs))

    def on_train_end(self, history, status):
        pass


class MetricsFile:
    """``OUT/metrics.json``: configuration, devices, versions and every epoch so far,
    rewritten atomically after each epoch so an interrupted run keeps its figures."""

    def __init__(self, path, header):
        self.path, self.header = path, dict(header)

    def write(self, history, status):
        write_json(self.path, {**self.header, "status": status, "epochs": history})

    def on_epoch_end(self, record, history):
        self.write(history, "running")

    def on_train_end(self, history, status):
        self.write(history, status)


class CurvesPlot:
    """``OUT/curves.png``: training loss, and train/validation accuracy, per epoch."""

    def __init__(self, path):
        self.path = path

    def on_epoch_end(self, record, history):
        pass

    def on_train_end(self, history, status):
        if history:
            plot_curves(history, self.path)


def plot_curves(history, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, [r["train_loss"] for r in history], marker="o", label="train loss")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("cross-entropy")
    ax_loss.legend()
    ax_acc.plot(epochs, [r["train_acc"] for r in history], marker="o", label="train")
    ax_acc.plot(epochs, [r["val_acc"] for r in history], marker="o", label="validation")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("accuracy")
    ax_acc.legend()
    fig.tight_layout()
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=100))
    plt.close(fig)
