"""Image folders in Gluon's ``ImageFolderDataset`` layout (``DIR/train/<class>/*``,
``DIR/val/<class>/*``): scanned from the files' headers, read per sample
(sources.FolderSource): decoded whole when the run keeps them in memory, batch by batch
by the loader's workers when it streams them."""
import os
from collections import namedtuple

from ..core.platform.errors import DataError
from .images import GRAY_MODES, open_image, parse_image_size
from .sources import FolderSource, from_sources

ScannedFolder = namedtuple("ScannedFolder", "train val classes channels size")
ScannedFolder.__doc__ = """An image folder's ``[(path, label)]`` per split, its class names, and the
channels and (H, W) its images decode to."""


def _scan(split_dir, classes=None):
    """``[(path, label)]`` and the class names of one split; files Pillow cannot
    identify are skipped and counted. ``classes``: the training split's names."""
    if not os.path.isdir(split_dir):
        raise DataError(f"{split_dir} does not exist: an image folder needs train/<class>/ and val/<class>/")
    names = sorted(d for d in os.listdir(split_dir) if os.path.isdir(os.path.join(split_dir, d))
                   and not d.startswith("."))  # hidden: .ipynb_checkpoints, .git, ... are no classes
    if not names:
        raise DataError(f"{split_dir} holds no class folders (expected {split_dir}/<class>/<image>)")
    if classes is not None:
        unknown = [n for n in names if n not in classes]
        if unknown:
            raise DataError(f"{split_dir}/{unknown[0]} is not a class of the training split ({', '.join(classes)})")
    items, skipped, headers = [], [], {}
    for name in names:
        folder = os.path.join(split_dir, name)
        found = 0
        for entry in sorted(os.listdir(folder)):
            path = os.path.join(folder, entry)
            if not os.path.isfile(path) or entry.startswith("."):  # hidden: .DS_Store, ._img.png, ...
                continue
            try:
                with open_image(path) as im:
                    headers[path] = (im.size, im.mode)
            except DataError as e:
                if "not an image" not in str(e):
                    raise
                skipped.append(path)
                continue
            items.append((path, (classes or names).index(name)))
            found += 1
        if found == 0:
            raise DataError(f"class folder {folder} holds no images")
    return items, names, skipped, headers


def scan_folder(root, image_size=None):
    """:class:`ScannedFolder` of ``root`` from the headers alone. Colour if any image is
    (grayscale ones are converted), else one channel. Without ``image_size`` every image
    must have the same size."""
    if not root:
        raise DataError("an image folder needs `data_dir` DIR (DIR/train/<class>/*, DIR/val/<class>/*)")
    if not os.path.isdir(root):
        raise DataError(f"`data_dir` {root} is not a directory")
    train, classes, skipped, headers = _scan(os.path.join(root, "train"))
    val, _, skipped_val, headers_val = _scan(os.path.join(root, "val"), classes)
    headers.update(headers_val)
    size = parse_image_size(image_size) if image_size else None
    if size is None:
        sizes = {}
        for path, ((w, h), _) in headers.items():
            sizes.setdefault((h, w), path)
        if len(sizes) > 1:
            (a, pa), (b, pb) = list(sizes.items())[:2]
            raise DataError(f"images differ in size ({a[1]}x{a[0]} {pa}, {b[1]}x{b[0]} {pb}): "
                            "pass `image_size` H[,W] to resize them")
        size = next(iter(sizes))
    channels = 1 if all(mode in GRAY_MODES for _, mode in headers.values()) else 3
    skipped += skipped_val
    if skipped:
        print(f"gluon_gpu: skipped {len(skipped)} file(s) that are not images, e.g. {skipped[0]}", flush=True)
    return ScannedFolder(train, val, classes, channels, size)


def read_folder(root, image_size=None, task=None):
    """A Dataset of an image folder's images, read from disk per sample."""
    if task not in (None, "classify"):
        raise DataError("an image folder is a classification dataset: `task` classify")
    found = scan_folder(root, image_size)
    return from_sources(*(FolderSource(items, found.channels, found.size, os.path.join(root, split))
                          for split, items in (("train", found.train), ("val", found.val))),
                        found.classes, "folder", root)
