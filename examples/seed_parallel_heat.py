"""Seed-parallel training on the heat equation, after PDEquinox's "Seed-Parallel training"
example: K independently seeded copies of a small 1D ConvNet learn one implicit time step
of the heat equation at once, sharing one dataset, and are timed against training the K
one after another.

Data: 48 interior points of a rod of length 3 (zero temperature at both ends), 1,000
random top-hat initial states, each advanced one backward-Euler (BTCS) step with dt 0.1
and diffusivity 0.1; the network regresses the next state from the current one.

    python examples/seed_parallel_heat.py [--seeds 10] [--epochs 60] [--samples 1000] [--out runs/heat]

Writes OUT/heat.json (every member's loss per epoch, the timings) and OUT/heat.png
(every member's loss curve and the members' spread).
"""
import argparse
import os
import time

import numpy as np
from mxnet.gluon import nn

import gluon_gpu
from gluon_gpu.core.loop.callbacks import save_figure, subplots
from gluon_gpu.core.platform.devices import describe
from gluon_gpu.core.platform.files import write_json
from gluon_gpu.data import DevicePipeline, from_arrays
from gluon_gpu.models import init_model, pipeline_layout

POINTS, LENGTH, DT, DIFFUSIVITY = 48, 3.0, 0.1, 0.1


def heat_data(samples, seed=0):
    """``(u0, u1)``: random top-hat states on the interior points and one BTCS step of each."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, LENGTH, POINTS + 2)[1:-1]
    left = rng.uniform(0, LENGTH * 0.8, (samples, 1))
    right = left + rng.uniform(0.1 * LENGTH, 0.5 * LENGTH, (samples, 1))
    u0 = rng.uniform(0.5, 1.5, (samples, 1)) * ((x > left) & (x < right))
    r = DIFFUSIVITY * DT / (LENGTH / (POINTS + 1)) ** 2
    step = (1 + 2 * r) * np.eye(POINTS) - r * (np.eye(POINTS, k=1) + np.eye(POINTS, k=-1))
    u1 = np.linalg.solve(step, u0.T).T  # (I - r L) u1 = u0, zero at both ends
    return u0.astype(np.float32), u1.astype(np.float32)


def conv_net():
    """The state (B, 48) as a one-channel signal through three same-size 1D convolutions."""
    net = nn.HybridSequential()
    net.add(nn.HybridLambda(lambda F, x: F.expand_dims(x, axis=1)),
            nn.Conv1D(16, 5, padding=2, activation="relu"),
            nn.Conv1D(16, 5, padding=2, activation="relu"),
            nn.Conv1D(1, 5, padding=2),
            nn.Flatten())
    return net


def train(net, ctx, data, members, seed, epochs, batch_size):
    """Train; per epoch, each member's mean training loss. Returns (curves, seconds)."""
    dp = gluon_gpu.DataParallel(net, ctx, "adam", {"learning_rate": 3e-3}, head="regress",
                                transform=data.spec.transform(members), batch_size=batch_size)
    layout = pipeline_layout(net, ctx)  # an ensemble: each group its members' columns (in turns on one device)
    batches = DevicePipeline(data.train_x, data.train_y, batch_size, layout.train_ctx, seed, members=members,
                             member_groups=layout.member_groups, in_turns=layout.in_turns)
    curves, start = [], time.perf_counter()
    for epoch in range(epochs):
        for x, y in batches.epoch(epoch):
            dp.step(x, y, return_loss=False)
        metrics = dp.read_metrics()  # the host sync
        curves.append(metrics["member_loss"] if members > 1 else [metrics["loss"]])
    return np.array(curves), time.perf_counter() - start


def plot(curves, path):
    fig, ax = subplots(figsize=(7, 4.5))
    epochs = np.arange(1, len(curves) + 1)
    for k in range(curves.shape[1]):
        ax.plot(epochs, curves[:, k], color="C0", alpha=0.35, linewidth=1)
    ax.fill_between(epochs, curves.min(1), curves.max(1), color="C0", alpha=0.15, label="members' spread")
    ax.plot(epochs, np.median(curves, 1), color="C1", label="median member")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (L2)")
    ax.set_title(f"{curves.shape[1]} seeds of a 1D ConvNet on one BTCS heat step")
    ax.legend()
    save_figure(fig, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--devices", default="all")
    p.add_argument("--out", default="runs/heat")
    args = p.parse_args()
    u0, u1 = heat_data(args.samples)
    split = args.samples * 9 // 10
    data = from_arrays(u0[:split], u1[:split], u0[split:], u1[split:])
    k, shape = args.seeds, data.spec.input_shape
    with gluon_gpu.devices(args.devices) as ctx:
        stack = gluon_gpu.ensemble(conv_net, k, ctx, seed=0, input_shape=shape, batch_size=args.batch_size)
        curves, together = train(stack, ctx, data, k, 0, args.epochs, args.batch_size)
        alone, apart = [], 0.0
        for seed in range(k):  # the same members, one after another on one device
            net = init_model(conv_net(), seed, ctx[:1], shape)
            curve, seconds = train(net, ctx[:1], data, 1, seed, args.epochs, args.batch_size)
            alone.append(curve[:, 0])
            apart += seconds
    final = curves[-1]
    print(f"{k} seeds on {describe(ctx)}, {args.epochs} epochs: final losses "
          f"{final.min():.2e} .. {final.max():.2e} (median {np.median(final):.2e})")
    print(f"together {together:.1f} s; one after another {apart:.1f} s; speedup {apart / together:.2f}x")
    print(f"largest difference between a member and its seed alone: "
          f"{max(abs(curves[:, s] - alone[s]).max() for s in range(k)):.1e} (loss)")
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "heat.json"),
               {"seeds": k, "epochs": args.epochs, "samples": args.samples, "devices": [str(c) for c in ctx],
                "member_loss": curves.tolist(), "alone_loss": np.array(alone).T.tolist(),
                "seconds_together": together, "seconds_one_after_another": apart})
    plot(curves, os.path.join(args.out, "heat.png"))
    print(f"wrote {args.out}/heat.json and {args.out}/heat.png")


if __name__ == "__main__":
    main()
