"""Image files: decoding with Pillow, guarded (sizes checked from the header, truncated
images refused, high-bit-depth grayscale scaled)."""
import warnings

import numpy as np

from ..core.platform.errors import DataError

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


def open_image(path, name=None):
    """A Pillow image whose header has been checked (size bounds), not yet decoded;
    DataError for anything that is not an image Pillow reads. ``path``: a file name or a
    file object (``name``: what errors call it)."""
    from PIL import Image, UnidentifiedImageError
    name = name or path
    try:
        with warnings.catch_warnings():  # Pillow's DecompressionBombWarning: bounded below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(path)
    except UnidentifiedImageError:
        raise DataError(f"{name}: not an image Pillow can read") from None
    except Image.DecompressionBombError as e:  # Pillow's own bound, above ours
        raise DataError(f"{name}: image is over the {MAX_PIXELS // 1_000_000}M pixels read here ({e})") from None
    except OSError as e:
        raise DataError(f"{name}: {e.strerror or e}") from None
    w, h = im.size
    if w * h > MAX_PIXELS:
        im.close()
        raise DataError(f"{name}: image is {w}x{h}, over the {MAX_PIXELS // 1_000_000}M pixels read here")
    if min(w, h) < MIN_SIDE:
        im.close()
        raise DataError(f"{name}: image is {w}x{h}; need at least {MIN_SIDE}x{MIN_SIDE} pixels")
    return im


def decode(path, channels, size=None, name=None):
    """uint8 ``(channels, H, W)`` from an image file (``size``: (H, W) to resize to);
    ``path`` and ``name`` as :func:`open_image`'s."""
    from PIL import Image, ImageFile
    # gluoncv's data package sets Pillow's process-wide LOAD_TRUNCATED_IMAGES on import;
    # a truncated image must be an error here whatever was imported before.
    tolerant, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, False
    try:
        with open_image(path, name) as im:
            im = _eight_bit(im, name or path).convert("L" if channels == 1 else "RGB")
            if size is not None and im.size != (size[1], size[0]):
                im = im.resize((size[1], size[0]), Image.BILINEAR)
            pixels = np.asarray(im, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError) as e:
        raise DataError(f"{name or path}: {e or type(e).__name__}") from None
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
