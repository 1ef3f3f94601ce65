"""Image folders to measure and test the streamed pipeline on (``DIR/train/<class>/*``,
``DIR/val/<class>/*``), written with a progress bar:

    python scripts/image_folders.py fashion OUT [--limit N]     # FashionMNIST as PNG files
    python scripts/image_folders.py colours OUT [--images 6000] [--size 192]

``fashion``: the real FashionMNIST (training split to train/, test split to val/) as
28x28 grayscale PNGs, for the bench's streamed-against-in-memory rows. ``colours``:
noisy RGB JPEGs of three classes told apart by their mean colour (6000 at 192x192 is
633 MiB decoded: the folder issue #25 was measured on), for memory figures.
"""
import argparse
import os
import sys

import numpy as np
from tqdm import tqdm

COLOURS = ("red", "green", "blue")


def write_images(root, images, labels, names, ext="png", progress=None, start=0):
    """``root/<names[label]>/<start + i>.<ext>`` for uint8 images ``(N, 1, H, W)`` or
    ``(N, 3, H, W)``."""
    from PIL import Image
    for i, (image, label) in enumerate(zip(images, labels), start):
        os.makedirs(os.path.join(root, names[label]), exist_ok=True)
        Image.fromarray(image[0] if len(image) == 1 else image.transpose(1, 2, 0)).save(
            os.path.join(root, names[label], f"{i:05d}.{ext}"), quality=90)
        if progress:
            progress()


def write_colours(root, count, size, rng, progress=None, chunk=300):
    """``count`` noisy RGB JPEGs ``size`` x ``size`` in ``root/<colour>/``, whose mean
    colour is the class (the classes take turns), made ``chunk`` at a time."""
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        labels = np.arange(start, start + n) % len(COLOURS)
        images = rng.integers(0, 150, (n, 3, size, size), dtype=np.uint8)
        images[np.arange(n), labels] += 100
        write_images(root, images, labels, COLOURS, "jpg", progress, start)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=("fashion", "colours"))
    p.add_argument("out")
    p.add_argument("--limit", type=int, default=None, help="fashion: the first N training images (all 60000)")
    p.add_argument("--images", type=int, default=6000, help="colours: training images (a sixth more to validate)")
    p.add_argument("--size", type=int, default=192, help="colours: the side in pixels")
    args = p.parse_args(argv)
    if os.path.exists(args.out):
        print(f"image_folders.py: {args.out} exists; give a new folder", file=sys.stderr)
        return 2
    written = []

    def progress():
        written.append(1)
        bar.update(1)
    with tqdm(unit="image", disable=not sys.stdout.isatty()) as bar:
        if args.kind == "fashion":
            from gluon_gpu.data.fashion_mnist import CLASSES, find_data_dir, load_split
            names = [c.replace("/", "-") for c in CLASSES]
            for split, (x, y) in (("train", load_split("train", find_data_dir(None, "train"), limit=args.limit)),
                                  ("val", load_split("test", find_data_dir(None, "test")))):
                write_images(os.path.join(args.out, split), x[:, None], y, names, "png", progress)
        else:
            rng = np.random.default_rng(0)
            for split, count in (("train", args.images), ("val", max(3, args.images // 6))):
                write_colours(os.path.join(args.out, split), count, args.size, rng, progress)
    print(f"wrote {len(written)} images to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
