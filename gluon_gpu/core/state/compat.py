"""Runs and files of older gluon_gpu versions, read as today's: every shim in one place.
Each function takes what an old version wrote (a dict of a checkpoint or of
metrics.json, a parameter file's arrays) and returns today's form; today's pass through
unchanged. The tests convert runs back to the old formats and resume them."""

# Until 0.1.x our LeNet had an explicit Flatten at index 4, which shifted the dense
# layers' file keys by one; the tutorial's Sequential has none (Dense flattens itself).
_LENET_0_1_KEYS = {"5.": "4.", "6.": "5.", "7.": "6."}
# Every ensemble before 0.3 was one fused network.
LAYOUT_BEFORE_0_3 = "fused"


def upgrade_lenet_keys(arrays):
    """Parameter-file keys of our LeNet before 0.2 (dense layers at 5, 6, 7) as today's
    (and the tutorial's: 4, 5, 6); other files pass unchanged."""
    if "7.weight" not in arrays or "4.weight" in arrays:
        return arrays
    return {_LENET_0_1_KEYS.get(k[:2], k[:2]) + k[2:]: v for k, v in arrays.items()}


def upgrade_config(values):
    """A saved run configuration: fields it predates take today's defaults, except the
    ensemble layout, which was fused; ``num_workers`` is ``loader_workers`` since 0.9.3."""
    values = {"ensemble_layout": LAYOUT_BEFORE_0_3, **values}
    if "num_workers" in values:
        values["loader_workers"] = values.pop("num_workers")
    return values


def upgrade_metric_state(metrics, width):
    """A checkpoint's metric sums as today's: before 0.2 ``{'loss', 'correct'}`` per
    device (metrics they did not keep, top-5, start from 0 for the rest of that epoch);
    before 0.4 without ``member_samples`` (every member had seen ``samples``)."""
    if "sums" not in metrics:
        sums = [loss + correct for loss, correct in zip(metrics["loss"], metrics["correct"])]
        metrics = {"sums": [s + [0.0] * (width - len(s)) for s in sums], "samples": metrics["samples"]}
    return {"member_samples": metrics["samples"], **metrics}
