"""Small, separate pieces that react to finished epochs: the log line, metrics.json, curves.png."""
import os

from .checkpoint import atomic_write, write_json


def format_epoch(record, epochs):
    """One human line per epoch (ensembles: member val-acc min/median/max, and the
    ensemble's; samples/s counts member-samples)."""
    members = record.get("member_val_acc")
    if members:
        accs = sorted(members)
        val = (f"member val-acc {accs[0]:.4f}/{accs[len(accs) // 2]:.4f}/{accs[-1]:.4f}  "
               f"ensemble val-acc {record['val_acc']:.4f}")
        rate = record["samples_per_s"] * len(members)
    else:
        val, rate = f"val-acc {record['val_acc']:.4f}", record["samples_per_s"]
    workers = f" ({record['workers']} workers)" if record.get("workers", 1) > 1 else ""
    return (f"epoch {record['epoch']:>3}/{epochs}  loss {record['train_loss']:.4f}  "
            f"train-acc {record['train_acc']:.4f}  {val}  "
            f"{record['seconds']:6.2f} s  {rate:8.0f} samples/s{workers}")


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


def subplots(*args, **kwargs):
    """matplotlib's ``subplots`` on the Agg backend (no display needed); imported late
    because matplotlib is slow to import and most commands never plot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(*args, **kwargs)


def save_figure(fig, path):
    """Write ``fig`` to ``path`` (format from the extension) atomically, then free it."""
    import matplotlib.pyplot as plt
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=100))
    plt.close(fig)


def plot_curves(history, path):
    epochs = [r["epoch"] for r in history]
    fig, (ax_loss, ax_acc) = subplots(1, 2, figsize=(10, 4))
    if "member_train_loss" in history[0]:  # one faint line per ensemble member
        for k, losses in enumerate(zip(*[r["member_train_loss"] for r in history])):
            ax_loss.plot(epochs, losses, color="C0", alpha=0.25, linewidth=1,
                         label="members" if k == 0 else None)
        for k, accs in enumerate(zip(*[r["member_val_acc"] for r in history])):
            ax_acc.plot(epochs, accs, color="C1", alpha=0.25, linewidth=1,
                        label="members (validation)" if k == 0 else None)
    ax_loss.plot(epochs, [r["train_loss"] for r in history], marker="o",
                 label="train loss" + (" (member mean)" if "member_train_loss" in history[0] else ""))
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("cross-entropy")
    ax_loss.legend()
    ax_acc.plot(epochs, [r["train_acc"] for r in history], marker="o", label="train")
    ax_acc.plot(epochs, [r["val_acc"] for r in history], marker="o",
                label="validation" + (" (ensemble)" if "member_val_acc" in history[0] else ""))
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("accuracy")
    ax_acc.legend()
    save_figure(fig, path)
