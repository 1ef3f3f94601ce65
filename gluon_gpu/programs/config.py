"""The run configuration: every flag a run has, declared once, with whether it may
change on --resume. The train CLI, the benchmark and --resume all build a run from a
:class:`RunConfig`; evaluate and predict take the flags they share with it from here."""
import argparse
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Optional

from ..core.loop.pruning import RULES as PRUNE_RULES
from ..core.state.compat import upgrade_config
from ..core.step.buckets import DEFAULT_BUCKET_MB
from ..core.step.heads import TASKS
from ..core.step.kvstores import KVSTORES
from ..core.step.precision import DTYPES
from ..data import DATASETS, PIPELINES
from ..data.augment import augment_help
from ..models.amx_features import MODES as BFLOAT16_KERNELS
from ..models.fused_conv import MODES
from ..models.member_stack import LAYOUTS
from ..models.zoo import MODELS, ZOO_EXAMPLES
from .cli import Renamed, as_flags, below_one, epoch_list, non_negative_float, non_negative_int, positive_float, \
    positive_int, process_count, restart_count, seed, thread_count, tta_text

OPTIMIZERS = ("sgd", "nag", "adam", "rmsprop", "adagrad")
LR_MODES = ("constant", "step", "cosine", "poly", "linear")
EPOCH_SHAPED_LR = ("cosine", "poly", "linear")  # laid out over --epochs
MONITORS = ("auto", "val-loss", "val-acc", "val-top5", "val-mse", "val-mae")
# What may differ between a sweep's members (programs/sweep.py): what the optimizer, its
# schedule and the loss do with the same batches of the same data.
SWEEPABLE = ("lr", "wd", "momentum", "lr_mode", "lr_decay", "lr_decay_epoch", "warmup_epochs", "warmup_lr",
             "label_smoothing", "mixup", "cutmix", "seed")


def _choices_help(described):
    """'name (what it is), ...' of a registry's {name: what}."""
    return as_flags(", ".join(f"{name} ({what})" for name, what in described.items()))


def _flag(default, help, resumable=False, brief=None, **argparse_kwargs):  # pylint: disable=redefined-builtin
    """A RunConfig field: its default, --help-all text, whether --resume may change it,
    ``brief``: for a flag most runs use, the text train's short --help shows (True: the
    same), and argparse options (type, choices, metavar, action)."""
    return field(default=default, metadata={"help": help, "resumable": resumable, "brief": brief, **argparse_kwargs})


@dataclass
class RunConfig:  # pylint: disable=too-many-instance-attributes
    # where it runs (may change on resume)
    devices: str = _flag("all", "device spec: all, cpu, cpu*N, gpu, gpu*N, gpu:I,J", True, brief=True)
    fused_conv: str = _flag("auto", "LeNet's conv+relu+pool as one compiled CPU operator (and --augment's "
                            "gather as another): auto (on CPUs, when it builds), on, off", True, choices=MODES)
    omp_threads: int = _flag(0, "OpenMP threads per CPU operator (sets OMP_NUM_THREADS; 0: as set, "
                             "else MXNet's default of half the logical CPUs)", True, type=thread_count)
    engine_threads: int = _flag(0, "MXNet engine worker threads per CPU context (sets "
                                "MXNET_CPU_WORKER_NTHREADS; 0: as set, else 1, and for an ensemble on one CPU "
                                "context one per core's worth of OpenMP threads, at most K)", True,
                                type=thread_count)
    bucket_mb: float = _flag(DEFAULT_BUCKET_MB, "several devices: gradients exchanged in contiguous buckets "
                             "of up to this many MiB, one kvstore key each; 0: one key per parameter",
                             True, type=non_negative_float)
    loader_workers: Optional[int] = _flag(None, "processes that read and decode batches (--pipeline loader) or "
                                          "decode the images a run keeps in memory; 0: in the main process "
                                          "(default: the cores this process may use, less one per CPU context; "
                                          "--num-workers: its old name, deprecated)", True,
                                          type=process_count, old="--num-workers")
    # the data
    dataset: str = _flag("fashion-mnist", "; ".join(f"{name}: --data-dir is {kind.what}"
                                                    for name, kind in DATASETS.items()),
                         choices=tuple(DATASETS),
                         brief="fashion-mnist, folder (an image folder), npz (arrays) or rec (RecordIO)")
    data_dir: Optional[str] = _flag(None, "FashionMNIST's IDX files (default: $GLUON_GPU_DATA, the MXNet "
                                    "cache, Debian's dataset-fashion-mnist), the image folder, the RecordIO "
                                    "folder, or the .npz", True,
                                    brief="where the data is (FashionMNIST: found if not given)")
    image_size: Optional[str] = _flag(None, "--dataset folder, rec: resize images to H or H,W", metavar="H[,W]",
                                      brief=True)
    task: Optional[str] = _flag(None, "classify or regress (default: from the labels: integers classify)",
                                choices=TASKS)
    limit: Optional[int] = _flag(None, "use only the first N training samples", type=positive_int, brief=True)
    val_limit: Optional[int] = _flag(None, "validate on only the first N validation samples", type=positive_int,
                                     brief=True)
    pipeline: str = _flag("auto", "device: data on the devices, batches by index; loader: Gluon DataLoader "
                          "over one host copy, or over the files of a folder or RecordIO dataset, read per batch "
                          "(streamed); auto: device when a copy per device fits in the memory this process may "
                          "use, else loader", choices=PIPELINES)
    # the model and its training
    model: str = _flag("auto", "auto (lenet for images, mlp for feature vectors), "
                       + _choices_help({name: kind.what for name, kind in MODELS.items()})
                       + ", or a gluoncv zoo classifier (" + ", ".join(ZOO_EXAMPLES[:3]) + ", ...)",
                       brief="lenet, mlp, or a gluoncv zoo classifier such as cifar_resnet20_v1")
    ensemble: int = _flag(1, "train K independent copies of the model at once (seed-parallel); member k "
                          "is the model --seed seed+k trains alone", type=positive_int, metavar="K",
                          brief="train K seeds of the model at once")
    ensemble_layout: str = _flag("auto", "how the members share the devices: " + _choices_help(LAYOUTS),
                                 choices=tuple(LAYOUTS))
    sweep: str = _flag("", "a hyperparameter sweep trained as one job, a member per configuration, each exactly as "
                       "its flags train alone: a grid 'lr=0.02,0.05 wd=0,1e-4' (every combination) of "
                       + ", ".join(n.replace("_", "-") for n in SWEEPABLE) + " (lr-decay-epoch=6/8); with "
                       "--sweep-random, ranges LO:HI and LO:HI:log too", metavar="SPEC",
                       brief="a hyperparameter sweep as one job, e.g. 'lr=0.02,0.05 wd=0,1e-4'")
    sweep_random: Optional[int] = _flag(None, "draw N configurations from --sweep (ranges, and one value of each "
                                        "list), seeded by --seed", type=positive_int, metavar="N")
    prune: str = _flag("off", "stop sweep members that fall behind on --monitor: off, "
                       + _choices_help(PRUNE_RULES), choices=("off",) + tuple(PRUNE_RULES))
    prune_warmup: int = _flag(1, "epochs (W) every member trains before --prune judges it", type=positive_int,
                              metavar="W")
    epochs: int = _flag(10, "epochs to train to", True, type=positive_int, brief=True)
    batch_size: int = _flag(256, "global batch size, split over the devices", type=positive_int, brief=True)
    lr: float = _flag(0.1, "base learning rate", type=positive_float, brief=True)
    optimizer: str = _flag("sgd", "optimizer", choices=OPTIMIZERS, brief=True)
    momentum: float = _flag(0.0, "sgd/nag only; below 1", type=below_one, brief=True)
    wd: float = _flag(0.0, "weight decay", type=non_negative_float, brief=True)
    no_wd: bool = _flag(False, "no weight decay on biases and BatchNorm's gamma and beta (GluonCV's --no-wd)",
                        action="store_true")
    label_smoothing: float = _flag(0.0, "classification: train on labels smoothed by EPS (1-EPS+EPS/K on the "
                                   "class, EPS/K on each of the K classes); validation and accuracy use the "
                                   "labels as they are", type=below_one, metavar="EPS")
    augment: str = _flag("", augment_help(), metavar="LIST",
                         brief="augmentation on the device: basic, strong, or a list such as flip,crop=4")
    mixup: float = _flag(0.0, "classification: mix each training image with a partner, weight lam ~ "
                         "Beta(ALPHA, ALPHA), and the loss of their labels likewise (GluonCV's --mixup; 0: off)",
                         type=non_negative_float, metavar="ALPHA")
    cutmix: float = _flag(0.0, "classification: paste a box of a partner image covering 1-lam of it, lam ~ "
                          "Beta(ALPHA, ALPHA), the labels' losses weighed by the areas (0: off)",
                          type=non_negative_float, metavar="ALPHA")
    ema: Optional[float] = _flag(None, "keep an exponential moving average of the weights with this decay "
                                 "(e.g. 0.999), validated each epoch and saved as ema.params; best.params takes it "
                                 "when its --monitor figure is better (0: none, to take a recipe's out)",
                                 type=below_one, metavar="DECAY")
    tta: str = _flag("", "test-time augmentation of validation: judge the mean log-probabilities of each image's "
                     "views: flip (and its mirror), shift=P (and each moved P pixels down-right and up-left), "
                     "e.g. flip,shift=1; none (fixed on --resume: best.params compares the epochs' figures)",
                     type=tta_text, metavar="LIST",
                     brief="test-time augmentation of validation: flip, flip,shift=1")
    mixup_off_epochs: int = _flag(0, "the last N epochs without --mixup or --cutmix (GluonCV's --mixup-off-epoch)",
                                  type=non_negative_int, metavar="N")
    recipe: Optional[str] = _flag(None, "a named bundle of training flags (--recipe list shows them with "
                                  "their measured results); flags given beside it override its own",
                                  metavar="NAME", brief="a named bundle of training flags (--recipe list)")
    lr_mode: str = _flag("constant", "gluoncv LRScheduler mode, stepped per batch", choices=LR_MODES,
                         brief="the learning rate schedule")
    lr_decay: float = _flag(0.1, "factor at each --lr-decay-epoch", type=positive_float)
    lr_decay_epoch: str = _flag("", "comma-separated epochs for --lr-mode step, increasing, e.g. 6,8",
                                type=epoch_list)
    warmup_epochs: int = _flag(0, "epochs of linear LR warmup from --warmup-lr, in front of any --lr-mode",
                               type=non_negative_int)
    warmup_lr: float = _flag(0.0, "the learning rate warmup starts from", type=non_negative_float)
    accumulate: int = _flag(1, "sum the gradients of N consecutive batches before one update: "
                            "--batch-size B --accumulate N trains like a batch of N x B", type=positive_int,
                            metavar="N")
    clip_grad: Optional[float] = _flag(None, "clip the global gradient norm (of the mean gradient, over all "
                                       "parameters, after the exchange) to NORM", type=positive_float,
                                       metavar="NORM")
    sync_bn: bool = _flag(False, "BatchNorm statistics over all devices of the process "
                          "(gluon.contrib.nn.SyncBatchNorm)", action="store_true")
    seed: int = _flag(0, "seeds initialization and the shuffle order", type=seed)
    hybridize: bool = _flag(True, "run the step as a static hybridized graph",
                            action=argparse.BooleanOptionalAction)
    kvstore: Optional[str] = _flag(None, "gradient aggregation (default: device on GPUs, local on CPUs)",
                                   choices=KVSTORES)
    dtype: str = _flag("float32", "bfloat16: mixed precision on CPUs with AVX-512 BF16 (see --bfloat16-kernels); "
                       "float16: the network cast to float16, GPUs only", choices=DTYPES,
                       brief="bfloat16: mixed precision on CPUs with AVX-512 BF16; float16: GPUs")
    amp: bool = _flag(False, "float16 mixed precision (contrib.amp, dynamic loss scaling): GPUs only",
                      action="store_true")
    bfloat16_kernels: str = _flag("auto", "--dtype bfloat16's kernels: onednn (a CIFAR ResNet v1's features on "
                                  "oneDNN 3's AMX kernels), amp (MXNet's, through contrib.amp), auto (onednn "
                                  "where the CPU has AMX and the network is one)", True, choices=BFLOAT16_KERNELS)
    # bookkeeping
    out: Optional[str] = _flag(None, "run directory (default runs/<timestamp>)", brief=True)
    log_interval: int = _flag(50, "batches between loss reads", True, type=positive_int)
    save_period: int = _flag(1, "epochs between checkpoints", True, type=positive_int)
    keep: int = _flag(3, "checkpoints kept", True, type=positive_int)
    commit_steps: int = _flag(0, "an elastic Horovod job (launch --elastic) commits its state, a checkpoint, every N "
                              "steps and at each epoch's end: what a reset goes back to (0: epoch ends only)", True,
                              type=non_negative_int, metavar="N")
    max_resets: int = _flag(20, "an elastic Horovod job: the most times a worker starts its training again from "
                            "the newest commit after the job's membership changed (or its process crashed)", True,
                            type=restart_count, metavar="N")
    monitor: str = _flag("auto", "the validation figure best.params and --early-stop follow (auto: val-acc "
                         "when classifying, val-mse when regressing)", choices=MONITORS)
    val_every: int = _flag(1, "validate every N epochs and always after the last one: the epochs between have no "
                           "validation figures (best.params judges the validated ones), and cost no validation time",
                           True, type=positive_int, metavar="N")
    early_stop: Optional[int] = _flag(None, "stop when --monitor has not improved for PATIENCE epochs", True,
                                      type=positive_int, metavar="PATIENCE")
    log_steps: bool = _flag(False, "metrics.csv (and TensorBoard) also get a row every --log-interval "
                            "batches", True, action="store_true")
    profile: Optional[int] = _flag(None, "profile N steps after a warm-up: RUN/profile.json (Chrome trace) "
                                   "and RUN/profile.txt (per operator)", True, type=positive_int, metavar="N")
    tensorboard: bool = _flag(False, "write TensorBoard event files to RUN/tb/ (tensorboardX)", True,
                              action="store_true")
    quiet: bool = _flag(False, "no progress bar", True, action="store_true", brief=True)

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, values):
        """A config from a saved one (compat.upgrade_config: of any version)."""
        known = {f.name for f in fields(cls)}
        values = upgrade_config(values)
        return cls(**{k: v for k, v in values.items() if k in known})


RESUMABLE = frozenset(f.name for f in fields(RunConfig) if f.metadata["resumable"])
# --help lists the flags in these groups, in this order, by what they are for.
GROUPS = {"data": ("dataset", "data_dir", "image_size", "task", "limit", "val_limit"),
          "model": ("model", "seed", "hybridize", "sync_bn"),
          "training": ("recipe", "epochs", "batch_size", "lr", "optimizer", "momentum", "wd", "no_wd", "lr_mode",
                       "lr_decay", "lr_decay_epoch", "warmup_epochs", "warmup_lr", "accumulate", "clip_grad"),
          "regularization": ("augment", "label_smoothing", "mixup", "cutmix", "mixup_off_epochs", "ema", "tta"),
          "distribution": ("devices", "kvstore", "bucket_mb"),
          "precision": ("dtype", "amp", "bfloat16_kernels"),
          "ensembles and sweeps": ("ensemble", "ensemble_layout", "sweep", "sweep_random", "prune", "prune_warmup"),
          "speed": ("pipeline", "loader_workers", "fused_conv", "omp_threads", "engine_threads"),
          "checkpoints": ("out", "save_period", "keep", "commit_steps", "max_resets", "monitor", "val_every",
                          "early_stop"),
          "logging": ("log_interval", "log_steps", "profile", "tensorboard", "quiet")}
GROUP_OF = {name: group for group, names in GROUPS.items() for name in names}
ALL_FLAGS = tuple(f.name for f in fields(RunConfig))
# The flags every command shares (evaluate and predict add their own).
COMMON_FLAGS = ("devices", "fused_conv", "omp_threads", "engine_threads", "batch_size", "data_dir", "quiet")


def flag_name(name):
    return "--" + name.replace("_", "-")


def as_argv(config):
    """The train flags that make ``config``: one for each value off its default."""
    argv = []
    for f in fields(RunConfig):
        value = getattr(config, f.name)
        if value == f.default:
            continue
        if isinstance(value, bool):
            argv.append(flag_name(f.name) if value else "--no-" + flag_name(f.name)[2:])
        else:
            argv += [flag_name(f.name), f"{value:g}" if isinstance(value, float) else str(value)]
    return argv


def add_flags(parser, names=ALL_FLAGS, many=(), defaults=None):
    """Add RunConfig's flags ``names`` to ``parser``; ``many``: flags that take several
    values (the benchmark compares them); ``defaults``: other defaults by name."""
    by_name = {f.name: f for f in fields(RunConfig)}
    for group in GROUPS:  # made in order, whichever flags come first
        if any(GROUP_OF[name] == group for name in names):
            parser.group(group)
    for name in names:
        f = by_name[name]
        meta = {k: v for k, v in f.metadata.items() if k not in ("help", "resumable", "brief", "old")}
        default = (defaults or {}).get(name, f.default if f.default is not MISSING else None)
        if name in many:
            meta["nargs"] = "+"
            default = None if default is None else [default]
        help_text = f.metadata["help"].replace("%", "%%")  # argparse %-formats help
        spellings = [flag_name(name)] + ([f.metadata["old"]] if f.metadata.get("old") else [])
        if len(spellings) > 1:
            meta["action"] = Renamed
        parser.group(GROUP_OF[name]).add_argument(*spellings, dest=name, default=default, help=help_text, **meta)
        if f.metadata["brief"] and parser.brief is not None:
            parser.brief[name] = None if f.metadata["brief"] is True else f.metadata["brief"]
