"""Image files: decoding with Pillow, guarded, and image folders in Gluon's
``ImageFolderDataset`` layout (``DIR/train/<class>/*``, ``DIR/val/<class>/*``)."""
import os
import warnings

import numpy as np

from ..core.errors import DataError
from ..core.memory import check_fits
from .arrays import from_arrays

MAX_PIXELS = 40_000_000  # checked from the header, before decoding (a 20000x20000 PNG is 400M)
MIN_SIDE = 8             # below this an image carries too little to learn or classify
# Pillow's high-bit-depth grayscale modes, by the value that is white in each (16-bit
# PNGs open as I;16, or as I in older Pillow; F: float TIFFs, white at 1.0). Pillow's
# convert("L") clips them at 255 (a dark 16-bit image came out white), so they are
# scaled instead; values outside 0..white have no 8-bit reading and are refused.
WIDE_MODES = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I;16N": 65535, "I": 65535, "F": 1.0}
GRAY_MODES = ("1", "L") + tuple(WIDE_MODES)


def parse_image_size(text):
    """'H' or 'H,W' -> (H, W)."""
    try:
        sides = [int(v) for v in str(text).split(",")]
    except ValueError:
        sides = []
    if len(sides) not in (1, 2) or min(sides) < MIN_SIDE:
        raise DataError(f"`image_size` {text!r}: expected H or H,W, each at least {MIN_SIDE}")
    return (sides[0], sides[-1])


def open_image(path):
    """A Pillow image whose header has been checked (size bounds), not yet decoded;
    DataError for anything that is not an image Pillow reads."""
    from PIL import Image, UnidentifiedImageError
    try:
        with warnings.catch_warnings():  # Pillow's DecompressionBombWarning: bounded below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(path)
    except UnidentifiedImageError:
        raise DataError(f"{path}: not an image Pillow can read") from None
    except Image.DecompressionBombError as e:  # Pillow's own bound, above ours
        raise DataError(f"{path}: image is over the {MAX_PIXELS // 1_000_000}M pixels read here ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: {e.strerror or e}") from None
    w, h = im.size
    if w * h > MAX_PIXELS:
        im.close()
        raise DataError(f"{path}: image is {w}x{h}, over the {MAX_PIXELS // 1_000_000}M pixels read here")
    if min(w, h) < MIN_SIDE:
        im.close()
        raise DataError(f"{path}: image is {w}x{h}; need at least {MIN_SIDE}x{MIN_SIDE} pixels")
    return im


def decode(path, channels, size=None):
    """uint8 ``(channels, H, W)`` from an image file (``size``: (H, W) to resize to)."""
    from PIL import Image, ImageFile
    # gluoncv's data package sets Pillow's process-wide LOAD_TRUNCATED_IMAGES on import;
    # a truncated image must be an error here whatever was imported before.
    tolerant, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, False
    try:
        with open_image(path) as im:
            im = _eight_bit(im, path).convert("L" if channels == 1 else "RGB")
            if size is not None and im.size != (size[1], size[0]):
                im = im.resize((size[1], size[0]), Image.BILINEAR)
            pixels = np.asarray(im, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError) as e:
        raise DataError(f"{path}: {e or type(e).__name__}") from None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = tolerant
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def _eight_bit(im, path):
    """``im``, a high-bit-depth grayscale one (:data:`WIDE_MODES`) scaled to 8 bits."""
    from PIL import Image
    if im.mode not in WIDE_MODES:
        return im
    white = WIDE_MODES[im.mode]
    values = np.asarray(im, dtype=np.float64)
    if not np.isfinite(values).all() or values.min() < 0 or values.max() > white:
        raise DataError(f"{path}: mode {im.mode} pixels span {values.min():g}..{values.max():g}, outside the "
                        f"0..{white:g} that scales to 8 bits")
    return Image.fromarray(np.rint(values * (255 / white)).astype(np.uint8), "L")


def _scan(split_dir, classes=None):
    """``[(path, label)]`` and the class names of one split; files Pillow cannot
    identify are skipped and counted. ``classes``: the training split's names."""
    if not os.path.isdir(split_dir):
        raise DataError(f"{split_dir} does not exist: an image folder needs train/<class>/ and val/<class>/")
    names = sorted(d for d in os.listdir(split_dir) if os.path.isdir(os.path.join(split_dir, d)))
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
            if not os.path.isfile(path):
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


def read_folder(root, image_size=None, task=None):
    """A Dataset from an image folder; every image decoded into memory as uint8.

    Colour if any image is (grayscale ones are converted), else one channel. Without
    ``image_size`` every image must have the same size."""
    if task not in (None, "classify"):
        raise DataError("an image folder is a classification dataset: `task` classify")
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

    check_fits({"host": (len(train) + len(val)) * channels * size[0] * size[1]},
               f"decoding the {len(train) + len(val)} images of {root} at {size[1]}x{size[0]}",
               "pass a smaller `image_size`")

    def arrays(items):
        images = np.empty((len(items), channels) + size, dtype=np.uint8)  # filled in place: one copy at most
        for i, (path, _) in enumerate(items):
            images[i] = decode(path, channels, size)
        return images, np.array([label for _, label in items], dtype=np.int64)
    return from_arrays(*arrays(train), *arrays(val), task="classify", classes=classes,
                       dataset="folder", source=root)
