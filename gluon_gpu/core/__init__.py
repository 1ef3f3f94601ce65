"""The core layer: devices, the data-parallel step (graphs, task heads, metric sums,
gradient buckets, kvstores), both MXNet APIs, checkpoints, atomic files and the epoch
loop. It knows no model and no dataset."""
