"""python -m gluon_gpu.predict: classify images (or IDX dataset entries) with saved parameters.

    python -m gluon_gpu.predict --params runs/RUN/net.params shoe.png shirt.jpg
    python -m gluon_gpu.predict --params runs/RUN/net.params --idx t10k-images-idx3-ubyte.gz --index 0:10

Images are read with Pillow, converted to grayscale, resized to 28x28 and normalized
exactly as in training (FashionMNIST is light garments on a black background).
"""
import json
import os
import sys

import numpy as np
from mxnet import gluon, nd

from .cli import add_model_flag, main_guard, parse_args, parser
from .data import CLASSES, Normalize, read_idx
from .devices import devices, gpu_count
from .errors import UserError
from .models import load_model

MIN_SIDE = 8  # below this an image carries too little to classify


def build_parser():
    p = parser("gluon_gpu.predict", __doc__)
    p.set_defaults(devices=None)
    p.add_argument("--params", required=True, help="a net.params file written by gluon_gpu.train")
    add_model_flag(p, default=None)
    p.add_argument("--idx", help="an IDX images file (.gz or not) to predict entries of")
    p.add_argument("--index", default="0:10", help="with --idx: START:STOP or one index")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("images", nargs="*", help="image files (PNG, JPEG, ...)")
    return p


def read_image(path):
    """uint8 (28, 28) from any image file Pillow reads; UserError for anything else."""
    from PIL import Image, ImageFile, UnidentifiedImageError
    # gluoncv's data package sets Pillow's process-wide LOAD_TRUNCATED_IMAGES on import;
    # a truncated image must be an error here whatever was imported before.
    tolerant, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, False
    try:
        with Image.open(path) as im:
            im.load()
            if min(im.size) < MIN_SIDE:
                raise UserError(f"{path}: image is {im.size[0]}x{im.size[1]}; need at least "
                                f"{MIN_SIDE}x{MIN_SIDE} pixels")
            gray = im.convert("L").resize((28, 28), Image.BILINEAR)
    except (UnidentifiedImageError, OSError, ValueError) as e:
        reason = "not an image Pillow can read" if isinstance(e, UnidentifiedImageError) else str(e)
        raise UserError(f"{path}: {reason or type(e).__name__}") from None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = tolerant
    return np.asarray(gray, dtype=np.uint8)


def parse_index(text, n):
    try:
        if ":" in text:
            start, stop = (int(t) if t else None for t in text.split(":", 1))
            rows = range(n)[slice(start, stop)]
        else:
            i = int(text)
            rows = range(n)[i:i + 1] if -n <= i < n else range(0)
    except ValueError:
        raise UserError(f"--index {text!r}: expected START:STOP or an index") from None
    if len(rows) == 0:
        raise UserError(f"--index {text!r} selects nothing from {n} images")
    return list(rows)


def predict(net, images, ctx):
    """Class probabilities (N, 10) for uint8 images (N, 28, 28), split over ``ctx``;
    an ensemble gives the mean of its members' softmax."""
    members = getattr(net, "members", 1)
    batch = nd.array(images, dtype="uint8")
    if members > 1:  # every member sees every image
        batch = batch.expand_dims(1).broadcast_to((len(images), members, 28, 28))
    shards = gluon.utils.split_and_load(batch, ctx[:len(images)], even_split=False)
    norm = Normalize(add_channel=members == 1)
    probs = [nd.softmax(net(norm(x)), axis=-1) for x in shards]
    if members > 1:
        probs = [p.mean(axis=1) for p in probs]
    return np.concatenate([p.asnumpy() for p in probs])


def _inputs(args):
    if args.idx and args.images:
        raise UserError("give image files or --idx, not both")
    if args.idx:
        images = read_idx(args.idx, 3)
        rows = parse_index(args.index, len(images))
        return [f"{args.idx}[{i}]" for i in rows], images[rows]
    if not args.images:
        raise UserError("nothing to predict: give image files or --idx FILE")
    for path in args.images:
        if not os.path.isfile(path):
            raise UserError(f"{path}: no such file")
    return list(args.images), np.stack([read_image(p) for p in args.images])


@main_guard("gluon_gpu.predict")
def main(argv=None):
    args = parse_args(build_parser(), argv)
    names, images = _inputs(args)
    spec = args.devices or ("gpu:0" if gpu_count() else "cpu")
    with devices(spec) as ctx:
        probs = predict(load_model(args.params, ctx, args.model, fused_conv=args.fused_conv), images, ctx)
    results = [{"input": name, "class": CLASSES[int(p.argmax())], "index": int(p.argmax()),
                "probability": float(p.max()), "probabilities": [float(v) for v in p]}
               for name, p in zip(names, probs)]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"{r['input']}: {r['class']} ({r['probability']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
