"""Run by tests/test_precision.py in a process of its own (MXNet's amp.init is
process-wide): the contrib.amp code path of --amp (dynamic loss scaling, the loss scale in
checkpoints) with bfloat16, the AMP target this CPU runs. Prints one JSON line of findings."""
import json
import sys
import tempfile

import mxnet as mx
import numpy as np
from mxnet import nd

from gluon_gpu import DataParallel
from gluon_gpu.core.state.checkpoint import load_checkpoint, save_checkpoint
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.data import load_dataset
from gluon_gpu.models import init_model


def make_dp(ctx):
    net = init_model("lenet", 0, ctx, fused_conv="off")
    return DataParallel(net, ctx, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, batch_size=64,
                        dtype="bfloat16", loss_scaling=True, transform=data.spec.transform())


def params(dp):
    return {k: [p.data(c).asnumpy() for c in dp.ctx] for k, p in dp.net._collect_params_with_prefix().items()}


data = load_dataset(limit=1024)
ctx = [mx.cpu(0), mx.cpu(1)]
x, y = nd.array(data.train_x[:64]), nd.array(data.train_y[:64])
dp = make_dp(ctx)
found = {"output_dtype": str(dp.net(dp.transform(x.as_in_context(ctx[0]))).dtype),
         "initial_scale": dp.trainer._amp_loss_scaler.loss_scale}
losses = [float(dp.step(x, y).asscalar()) for _ in range(20)]
after = params(dp)
found.update(loss_first=losses[0], loss_last=losses[-1],
             replicas_equal=all(np.array_equal(a[0], a[1]) for a in after.values()))
# An overflowing batch (an infinite input): the update is skipped and the scale halves.
bad = x.copy()
bad[0] = np.inf
dp.step(bad, y)
found["skipped_equal"] = all(np.array_equal(after[k][0], v[0]) for k, v in params(dp).items())
dp.step(x, y)  # the scale read at this update is the halved one
found["scale_after_overflow"] = dp.trainer._amp_loss_scaler.loss_scale
with tempfile.TemporaryDirectory() as run_dir:
    where = save_checkpoint(run_dir, dp, {"epoch": 1, "batch": 0})
    fresh = make_dp(ctx)
    load_checkpoint(where, fresh)
    found["restored_scale"] = fresh.trainer._amp_loss_scaler.loss_scale
    found["restored_unskipped"] = fresh.trainer._amp_loss_scaler._unskipped
    found["saved_unskipped"] = dp.trainer._amp_loss_scaler._unskipped
try:
    DataParallel(init_model("lenet", 0, ctx[:1], fused_conv="off"), ctx[:1], dtype="float32")
    found["float32_after_amp"] = "accepted"
except UserError as e:
    found["float32_after_amp"] = str(e)
print(json.dumps(found))
sys.stdout.flush()
