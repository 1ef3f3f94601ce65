"""What every command line shares: common flags, value checks, and turning UserError
into one line on stderr with exit status 2."""
import argparse
import functools
import sys

from .errors import UserError


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (exit 2), not usage plus error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text):
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text):
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


MAX_SEED = 2 ** 32 - 1  # numpy's and MXNet's seed range


def seed(text):
    value = _number(int, text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_SEED}, got {text!r}")
    return value


def positive_float(text):
    value = _number(float, text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text):
    value = _number(float, text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def _number(kind, text):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a {'whole ' if kind is int else ''}number: {text!r}") from None


def parser(prog, description, compare=False):
    """A parser with the flags every gluon_gpu command takes (``compare``: --devices and
    --fused-conv take lists, for the benchmark, which times every combination)."""
    from .fused_conv import MODES
    p = Parser(prog=prog, description=description,
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--devices", default=None if compare else "all",
                   nargs="+" if compare else None,
                   help="device spec: all, cpu, cpu*N, gpu, gpu*N, gpu:I,J"
                        + (" (several to compare)" if compare else ""))
    p.add_argument("--fused-conv", choices=MODES, default=["auto"] if compare else "auto",
                   nargs="+" if compare else None,
                   help="LeNet's conv+relu+pool as one compiled CPU operator: auto (on CPUs, "
                        "when it builds), on, off" + (" (several to compare)" if compare else ""))
    p.add_argument("--batch-size", type=positive_int, default=256,
                   help="global batch size, split over the devices")
    p.add_argument("--data-dir", default=None,
                   help="directory with the FashionMNIST IDX .gz files "
                        "(default: $GLUON_GPU_DATA, the MXNet cache, Debian's dataset-fashion-mnist)")
    p.add_argument("--omp-threads", type=non_negative_int, default=0,
                   help="OpenMP threads per CPU operator (sets OMP_NUM_THREADS; 0: as set, "
                        "else MXNet's default of half the logical CPUs)")
    p.add_argument("--engine-threads", type=non_negative_int, default=0,
                   help="MXNet engine worker threads per CPU context (sets "
                        "MXNET_CPU_WORKER_NTHREADS; 0: as set, else 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def parse_args(p, argv=None):
    """Parse ``argv`` (None: the command line) and bring the thread flags into effect;
    MXNet reads them only at start, so the program re-executes itself if they differ
    from its environment (see ``devices.require_thread_settings``)."""
    args = p.parse_args(argv)
    from .devices import require_thread_settings
    require_thread_settings(args.omp_threads, args.engine_threads, restart=argv is None)
    return args


def add_model_flag(p, default="lenet"):
    from .models import model_names
    p.add_argument("--model", default=default, choices=model_names(),
                   help="network: the tutorial LeNet or a gluoncv CIFAR-style zoo model")


def add_bucket_flag(p):
    from .buckets import DEFAULT_BUCKET_MB
    p.add_argument("--bucket-mb", type=non_negative_float, default=DEFAULT_BUCKET_MB,
                   help="several devices: gradients exchanged in contiguous buckets of up to this "
                        "many MiB, one kvstore key each; 0: one key per parameter")


def check_batch(batch_size, ctx):
    if batch_size < len(ctx):
        raise UserError(f"--batch-size {batch_size} is smaller than the {len(ctx)} devices: "
                        "every device needs at least one sample")


def progress_enabled(args):
    """A tqdm bar only for a person watching: stdout is a terminal and no --quiet."""
    return not args.quiet and sys.stdout.isatty()


def main_guard(prog):
    """Decorate a CLI ``main(argv) -> int``: UserError -> 'prog: error: ...' on stderr, exit 2."""
    def decorate(main):
        @functools.wraps(main)
        def run(argv=None):
            try:
                return main(argv)
            except SystemExit as e:  # argparse: --help, or a bad flag already reported
                return e.code
            except UserError as e:
                print(f"{prog}: error: {e}", file=sys.stderr)
                return 2
        return run
    return decorate
