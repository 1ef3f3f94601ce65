"""What a sweep leaves a person to act on: every member's figures per epoch in the
epoch records, a table of the members sorted by the --monitor figure (on screen, in
RUN/sweep.csv and metrics.json), their curves in one plot (RUN/sweep.png), and the best
member alone in best.params (core/early_stopping.MemberMonitor)."""
import csv
import io
import os

from ..core.loop.callbacks import Callback, save_figure, subplots
from ..core.loop.early_stopping import MemberMonitor
from ..core.platform.files import write_text
from .cli import text_table
from .sweep import member_label, varied


def sweep_monitor(flag, metric_names, members):
    """The MemberMonitor of a sweep of ``members`` (RunConfigs)."""
    return MemberMonitor(flag, metric_names, [member_label(m, varied(members)) for m in members])


class SweepRecord(Callback):
    """Callback, before any that writes the record: a sweep's members are separate
    models, so the figures of their combined vote (an ensemble's ``val_<name>``) are no
    figure of the job and leave the record; each member's stay (``member_val_<name>``)."""

    def on_epoch_end(self, record, history):
        for key in [k for k in record if k.startswith("val_")]:
            del record[key]

    def on_train_end(self, history, status, reason=None):
        pass


class SweepTable(Callback):
    """Callback: at the end, ``RUN/sweep.csv`` and ``RUN/sweep.png``; ``describe()`` is
    the table the run prints last. ``rows(history)`` also goes to metrics.json."""

    def __init__(self, out, members, monitor):
        self.out, self.members, self.monitor = out, members, monitor
        self.varied = varied(members)
        self.history = []

    def rows(self, history):
        """One dict per member, best first: its values of the varied flags, its best
        figure and epoch, its last figure, and the epoch it was pruned after (or None: it
        trained every epoch, a stop decided after the last one included, which only a
        longer resumed run would act on)."""
        stopped = history[-1].get("stopped", {}) if history else {}
        last = history[-1]["epoch"] if history else 0
        stopped = {k: e for k, e in stopped.items() if e < last}
        rows = []
        for k, member in enumerate(self.members):
            figures = [(r["epoch"], self.monitor.figures(r).get(k)) for r in history]
            figures = [(e, v) for e, v in figures if v is not None]
            pick = min if self.monitor.lower else max
            best = pick(figures, key=lambda f: f[1]) if figures else (None, None)
            rows.append({"member": k, **{n: getattr(member, n) for n in self.varied}, "best": best[1],
                         "best_epoch": best[0], "last": figures[-1][1] if figures else None,
                         "pruned_after": stopped.get(str(k))})
        ranked = [r for r in rows if r["best"] is not None]
        ranked.sort(key=lambda r: r["best"] if self.monitor.lower else -r["best"])
        return ranked + [r for r in rows if r["best"] is None]

    def table(self, history):
        flag = self.monitor.flag
        columns = [("member", 8, lambda r: str(r["member"]))]
        columns += [(n.replace("_", "-"), max(10, len(n) + 2), _cell(n)) for n in self.varied]
        columns += [(f"best {flag}", 16, _number("best")), ("epoch", 7, lambda r: str(r["best_epoch"] or "-")),
                    (f"last {flag}", 16, _number("last")),
                    ("stopped", 18, lambda r: f"pruned after {r['pruned_after']}" if r["pruned_after"] else "ran to the end")]
        return text_table(columns, self.rows(history), f"sweep of {len(self.members)}, best first by {flag}:")

    def describe(self):
        return self.table(self.history) if self.history else "sweep: no epoch finished"

    def on_epoch_end(self, record, history):
        self.history = history

    def on_train_end(self, history, status, reason=None):
        self.history = history
        if not history:
            return
        rows = self.rows(history)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text(os.path.join(self.out, "sweep.csv"), buffer.getvalue())
        self.plot(history, os.path.join(self.out, "sweep.png"))

    def plot(self, history, path):
        """The monitored figure of every member per epoch, one labelled line each (a
        pruned member's line ends where it stopped), the best member's bold."""
        fig, ax = subplots(figsize=(8, 5))
        best = self.rows(history)[0]["member"]
        for k, label in enumerate(self.monitor.labels):
            points = [(r["epoch"], self.monitor.figures(r).get(k)) for r in history]
            points = [(e, v) for e, v in points if v is not None]
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, linewidth=2.5 if k == best else 1,
                        label=f"{k}: {label}" + (" (best)" if k == best else ""))
        ax.set_xlabel("epoch")
        ax.set_ylabel(self.monitor.flag)
        ax.legend(fontsize="small")
        save_figure(fig, path)


def _cell(name):
    return lambda r: str(r[name]).replace(",", "/") if isinstance(r[name], str) else f"{r[name]:g}"


def _number(key):
    return lambda r: "-" if r[key] is None else f"{r[key]:.4f}"
