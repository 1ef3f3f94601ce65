"""RecordIO datasets (``--dataset rec``): ``DIR/train.rec`` + ``train.idx`` and
``DIR/val.rec`` + ``val.idx`` as MXNet's ``im2rec`` and ``gluon_gpu.pack`` write them,
read record by record through ``mx.recordio`` and decoded with Pillow, as a folder's
files are (so a folder packed without resizing trains exactly as the folder).
``DIR/meta.json``, which pack writes, carries the class names; without it the classes
are the label numbers."""
import io
import json
import os
import struct

import numpy as np

from ..core.platform.errors import DataError
from ..core.platform.files import fsync_path
from ..core.platform.pools import PoolWatch, partial_path, remove_dead_partials
from .images import decode, open_image, parse_image_size
from .sources import ImageSource, from_sources

RECORD_MAGIC = 0xced7230a  # dmlc's RecordIO: magic, length word, then MXNet's IRHeader
HEADER = struct.Struct("<IIIfQQ")  # magic, cflag<<29 | length, flag, label, id, id2
SPLITS = ("train", "val")


class RecordSource(ImageSource):
    """The images of a RecordIO file as MXNet's ``im2rec`` and ``gluon_gpu.pack`` write
    them (``.rec`` with its ``.idx``), read through ``mx.recordio`` and decoded with
    Pillow as a folder's files are. ``keys``: the records, in order; ``resize``: resize
    each image to ``size`` (else a record of another size is refused)."""

    def __init__(self, rec, idx, keys, labels, channels, size, resize):
        super().__init__(labels, (channels,) + tuple(size), rec)
        self.rec, self.idx, self.keys, self.resize = rec, idx, list(keys), resize
        self._reader = None

    def __getstate__(self):  # a worker process opens its own reader
        return {**self.__dict__, "_reader": None}

    def payload(self, i):
        """The encoded image of sample ``i``."""
        from mxnet import recordio
        if self._reader is None or self._reader.pid != os.getpid():
            self._reader = recordio.MXIndexedRecordIO(self.idx, self.rec, "r")
        try:
            return recordio.unpack(self._reader.read_idx(self.keys[i]))[1]
        except Exception as e:  # MXNetError from the C++ reader: not a record where the .idx says
            raise DataError(f"{self.rec}: record {self.keys[i]} cannot be read ({_first_line(e)})") from None

    def read(self, i):
        name = f"{self.rec} record {self.keys[i]}"
        size = self.sample_shape[1:] if self.resize else None
        image = decode(io.BytesIO(self.payload(i)), self.sample_shape[0], size, name=name)
        if image.shape != self.sample_shape:
            raise DataError(f"{name} is {image.shape[2]}x{image.shape[1]}, the first record "
                            f"{self.sample_shape[2]}x{self.sample_shape[1]}: pass `image_size` H[,W] to resize them")
        return image

    def first(self, n):
        return RecordSource(self.rec, self.idx, self.keys[:n], self.labels[:n], self.sample_shape[0],
                            self.sample_shape[1:], self.resize)


def _first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def read_record_headers(rec, idx):
    """``(keys, labels)`` of the records ``idx`` lists, from each record's header alone
    (32 bytes at the offset the .idx gives): the labels without reading the images.
    DataError, naming the file, for a missing .idx, an .idx that does not match its .rec,
    or a record with more than one label."""
    for path in (rec, idx):
        if not os.path.isfile(path):
            raise DataError(f"{path} does not exist" + (": RecordIO needs the .idx beside the .rec (im2rec and "
                                                       "gluon_gpu.pack write both)" if path == idx else ""))
    keys, offsets = [], []
    with open(idx) as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            try:
                keys.append(int(fields[0]))
                offsets.append(int(fields[1]))
            except (IndexError, ValueError):
                raise DataError(f"{idx} line {number}: expected 'key<TAB>offset', got {line.strip()[:60]!r}") from None
    if not keys:
        raise DataError(f"{idx} lists no records")
    size = os.path.getsize(rec)
    labels = np.empty(len(keys), dtype=np.float64)
    with open(rec, "rb") as f:
        for n, (key, offset) in enumerate(zip(keys, offsets)):
            f.seek(offset)
            raw = f.read(HEADER.size)
            magic, length, flag, label, _, _ = HEADER.unpack(raw) if len(raw) == HEADER.size else (0,) * 6
            if magic != RECORD_MAGIC or offset + 8 + (length & (2 ** 29 - 1)) > size:
                raise DataError(f"{idx} does not match {rec}: no record of key {key} at offset {offset}")
            if flag:
                raise DataError(f"{rec}: record {key} holds {flag} labels; gluon_gpu classifies with one per image")
            labels[n] = label
    if not np.array_equal(labels, np.round(labels)) or labels.min() < 0:
        bad = labels[(labels != np.round(labels)) | (labels < 0)][0]
        raise DataError(f"{rec}: label {bad:g} is not a class number 0, 1, ...")
    return keys, labels.astype(np.int64)


def read_rec(root, image_size=None, task=None):
    """A Dataset of the RecordIO files in ``root``, read from disk per sample."""
    if task not in (None, "classify"):
        raise DataError("a RecordIO dataset is a classification dataset: `task` classify")
    if not root:
        raise DataError("a RecordIO dataset needs `data_dir` DIR holding train.rec, train.idx, val.rec, val.idx")
    if not os.path.isdir(root):
        raise DataError(f"`data_dir` {root} is not a directory")
    meta = _read_meta(os.path.join(root, "meta.json"))
    splits = {split: read_record_headers(os.path.join(root, f"{split}.rec"), os.path.join(root, f"{split}.idx"))
              for split in SPLITS}
    classes = meta.get("classes") or [str(c) for c in range(int(splits["train"][1].max()) + 1)]
    size = parse_image_size(image_size) if image_size else None
    if "channels" in meta and "image_size" in meta:
        channels, first = int(meta["channels"]), tuple(meta["image_size"])
    else:  # im2rec's files: the first training image says
        probe = RecordSource(os.path.join(root, "train.rec"), os.path.join(root, "train.idx"), splits["train"][0][:1],
                             splits["train"][1][:1], 3, (1, 1), resize=False)
        image = decode(io.BytesIO(probe.payload(0)), 3, name=f"{probe.rec} record {probe.keys[0]}")
        channels = 1 if (image[0] == image[1]).all() and (image[0] == image[2]).all() else 3
        first = image.shape[1:]
    return from_sources(*(RecordSource(os.path.join(root, f"{split}.rec"), os.path.join(root, f"{split}.idx"),
                                       *splits[split], channels, size or first, resize=size is not None)
                          for split in SPLITS), classes, "rec", root)


def _read_meta(path):
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: {e}") from None
    return meta


ENCODINGS = ("auto", "jpg", "png")


def encode_image(job):
    """The bytes pack stores for one image file, ``job``: ``(path, channels, size,
    encoding, quality)``. ``auto``: the file itself when it is a JPEG or PNG of the
    dataset's size (it then decodes to the folder's very pixels), else the decoded image
    as PNG (lossless); ``jpg``, ``png``: decoded, resized to ``size`` and encoded so."""
    from PIL import Image
    path, channels, size, encoding, quality = job
    if encoding == "auto":
        with open_image(path) as im:
            kept = im.format in ("JPEG", "PNG") and im.size == (size[1], size[0])
        if kept:
            with open(path, "rb") as f:
                return f.read()
    pixels = decode(path, channels, size)
    image = Image.fromarray(pixels[0] if channels == 1 else pixels.transpose(1, 2, 0))
    out = io.BytesIO()
    image.save(out, format="JPEG" if encoding == "jpg" else "PNG", quality=quality)
    return out.getvalue()


def _encode_chunk(jobs):
    return [encode_image(job) for job in jobs]


def _encoded_by(watch, jobs, size=8):
    """``encode_image`` of each job by the processes of ``watch`` (a PoolWatch), in order,
    8 to a task (what ``imap``'s chunksize does, but through an iterator that can wait
    with a timeout)."""
    chunks = iter(lambda: [job for _, job in zip(range(size), jobs)], [])
    for chunk in watch.each(watch.pool.imap(_encode_chunk, chunks)):
        yield from chunk


def write_split(items, out, split, channels, size, encoding="auto", quality=95, num_workers=0, progress=None):
    """``out/split.rec`` and ``.idx`` of ``items`` (``[(path, label)]``), the images
    encoded by ``num_workers`` processes (:func:`encode_image`) and written in order,
    keys 0, 1, ...; both files appear whole or not at all. ``progress()``: after each."""
    from mxnet import recordio
    rec, idx = (os.path.join(out, f"{split}.{ext}") for ext in ("rec", "idx"))
    for path in (rec, idx):
        remove_dead_partials(path)  # a pack killed mid-write left its own
    partial = [partial_path(path) for path in (rec, idx)]
    writer = recordio.MXIndexedRecordIO(partial[1], partial[0], "w")
    jobs = ((path, channels, size, encoding, quality) for path, _ in items)
    watch = PoolWatch(num_workers, "a pack worker") if num_workers else None
    try:
        encoded = _encoded_by(watch, jobs) if watch else map(encode_image, jobs)
        for key, ((_, label), payload) in enumerate(zip(items, encoded)):
            writer.write_idx(key, recordio.pack(recordio.IRHeader(0, float(label), key, 0), payload))
            if progress:
                progress()
    except BaseException:  # a bad image, Ctrl-C: no half-written files left behind
        writer.close()
        for path in partial:
            os.remove(path)
        raise
    finally:
        writer.close()
        if watch:
            watch.end()
    for path in partial:
        fsync_path(path)
    os.replace(partial[0], rec)
    os.replace(partial[1], idx)  # the .idx last: a .rec without its .idx is refused, not misread
    fsync_path(out)
    return rec
