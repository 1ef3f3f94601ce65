"""Decoding speed of a RecordIO file, one core each way: MXNet's C++ ImageRecordIter
(OpenCV, one preprocess thread) against gluon_gpu's loader pipeline (Gluon's DataLoader,
one worker, Pillow), two passes each; docs/maintainers/measurements.md keeps the figures.

    .venv/bin/python scripts/decode_speed.py REC_DIR C,H,W
"""
import sys
import time

import mxnet as mx

from gluon_gpu.data import load_dataset
from gluon_gpu.data import LoaderPipeline

rec, shape = sys.argv[1], tuple(int(v) for v in sys.argv[2].split(","))
res = {}
it = mx.io.ImageRecordIter(path_imgrec=f"{rec}/train.rec", path_imgidx=f"{rec}/train.idx", data_shape=shape,
                           batch_size=64, shuffle=True, preprocess_threads=1, prefetch_buffer=2)
for _ in range(2):
    it.reset()
    t, n = time.perf_counter(), 0
    for b in it:
        b.data[0].wait_to_read()
        n += b.data[0].shape[0] - b.pad
    res["ImageRecordIter, 1 thread (OpenCV)"] = (time.perf_counter() - t, n)
pipe = LoaderPipeline(load_dataset("rec", rec, decoded=False).train_x, 64, num_workers=1)
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for x, _ in pipe.epoch(epoch):
        x.wait_to_read()
        n += x.shape[0]
    res["DataLoader, 1 worker (Pillow)"] = (time.perf_counter() - t, n)
for name, (seconds, n) in res.items():
    print(f"{name}: {n} images in {seconds:.2f} s = {n / seconds:.0f} images/s")
