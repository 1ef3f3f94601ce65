"""An image folder (FOLDER/train/<class>/*,
FOLDER/val/<class>/*) packed into RecordIO, the format GluonCV and MXNet's im2rec use:
OUT/train.rec, train.idx, val.rec, val.idx, and OUT/meta.json with the class names.

    gluon-gpu-pack photos/ photos-rec/ --image-size 224
    gluon-gpu-train --dataset rec --data-dir photos-rec/

Without --image-size every image must have the folder's one size, and JPEG and PNG
files are stored as they are: the packed data trains exactly as the folder does. With
it, each image is resized and stored as JPEG (--quality) or PNG (--encoding png).
Images are decoded in --processes processes (default: every core this process may use).
"""
import argparse
import os

from tqdm import tqdm

from ..core.platform.environment import usable_cpus
from ..core.platform.errors import UserError
from ..core.platform.files import write_json
from ..core.platform.memory import check_fits, size_text
from ..data.folders import scan_folder
from ..data.recordio import ENCODINGS, SPLITS, write_split
from .cli import Parser, Renamed, command, main_guard, non_negative_int, process_count, progress_enabled


def build_parser():
    p = Parser("pack", description=__doc__)
    p.add_argument("folder", help="the image folder: FOLDER/train/<class>/*, FOLDER/val/<class>/*")
    p.add_argument("out", help="the folder to write train.rec, train.idx, val.rec, val.idx and meta.json into")
    p.add_argument("--image-size", metavar="H[,W]", help="resize every image to H or H,W")
    p.add_argument("--encoding", default="auto", choices=ENCODINGS,
                   help="auto: JPEG and PNG files as they are when not resized, else JPEG; jpg; png")
    p.add_argument("--quality", type=_quality, default=95, help="JPEG quality, 1-100")
    p.add_argument("--processes", "--num-workers", dest="processes", type=process_count, default=None,
                   action=Renamed, help="processes decoding and encoding images (0: this one; default: the usable "
                                        "cores; --num-workers: its old name, deprecated)")
    p.add_argument("--overwrite", action="store_true", help="replace the RecordIO files OUT already holds")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _quality(text):
    value = non_negative_int(text)
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"a JPEG quality is 1 to 100, not {value}")
    return value


def _check_out(folder, out):
    """Refuse an OUT inside the images it packs (FOLDER/train or FOLDER/val): its files
    would be read as images of a class, by this pack or the next."""
    for split in SPLITS:
        images = os.path.realpath(os.path.join(folder, split))
        if os.path.commonpath([images, os.path.realpath(out)]) == images:
            raise UserError(f"OUT {out} is inside FOLDER's {split} images: choose a folder outside {images}")


@main_guard("gluon_gpu.pack")
def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.encoding == "auto" and args.image_size:
        args.encoding = "jpg"  # resized images have no file to keep
    found = scan_folder(args.folder, args.image_size)
    _check_out(args.folder, args.out)
    workers = usable_cpus() if args.processes is None else args.processes
    processes = max(1, workers)  # 0 workers: this process encodes
    image = found.channels * found.size[0] * found.size[1]
    check_fits({"host": 3 * processes * image},  # each process's image: decoded, resized and encoded
               f"packing images of {found.channels}x{found.size[0]}x{found.size[1]} with {processes} "
               f"process{'es' * (processes > 1)}", "pass a smaller --image-size, or fewer --processes")
    existing = [f"{split}.rec" for split in SPLITS if os.path.exists(os.path.join(args.out, f"{split}.rec"))]
    if existing and not args.overwrite:
        raise UserError(f"{args.out} already holds {existing[0]}: pass --overwrite to replace it")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {args.out}: {e.strerror}") from None
    sizes = 0
    with tqdm(total=len(found.train) + len(found.val), desc="pack", unit="image",
              disable=not progress_enabled(args)) as bar:
        for split, items in (("train", found.train), ("val", found.val)):
            rec = write_split(items, args.out, split, found.channels, found.size, args.encoding, args.quality,
                              workers, lambda: bar.update(1))
            sizes += os.path.getsize(rec)
    write_json(os.path.join(args.out, "meta.json"),
               {"classes": found.classes, "channels": found.channels, "image_size": list(found.size),
                "train": len(found.train), "val": len(found.val), "encoding": args.encoding,
                "source": os.path.abspath(args.folder)})
    train = command("train", "--dataset", "rec", "--data-dir", args.out)
    print(f"packed {len(found.train)} training and {len(found.val)} validation images of {args.folder} "
          f"({len(found.classes)} classes, {found.channels}x{found.size[0]}x{found.size[1]}, {args.encoding}) into "
          f"{args.out}: {size_text(sizes)}; train with: {train}")
    return 0
