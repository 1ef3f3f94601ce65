"""Load saved parameters onto any device and report the
validation loss and metrics of the run's task, on the run's own validation data.

On CPU contexts the network runs as oneDNN's fused inference graph (conv+BN+ReLU as
one primitive); ``--int8`` quantizes it, calibrated on training samples, and reports
the change against float32."""
import mxnet as mx
from mxnet import nd

from ..core.platform.devices import describe, devices, parse_devices, thread_settings
from ..core.platform.errors import UserError
from ..core.step.heads import head_for
from ..core.step.members import member_count
from ..core.step.parallel import DataParallel
from ..core.step.tta import check_tta, parse_tta
from ..data import DataSpec, load_dataset, make_pipeline
from ..data.sources import sample_batches
from ..models import load_model, params_in, pipeline_layout, recorded_run
from ..models.inference import MODES, inference_mode, inference_model, inference_threads
from .cli import Parser, check_batch, main_guard, non_negative_int, parse_args, positive_int
from .config import COMMON_FLAGS, add_flags

COUNTS = ("samples", "predicted_classes")  # in the figures, beside the metrics


def build_parser():
    p = Parser("evaluate", description=__doc__, brief=True)
    add_flags(p, COMMON_FLAGS + ("pipeline", "tta"))
    add_saved_model_flags(p)
    add_inference_flags(p)
    p.brief_flags("params", "model", "member", "inference", "pipeline")
    return p


def one_dnn_threads(args, spec=None):
    """``parse_args``'s ``adjust`` for evaluate and predict: every core's OpenMP threads
    for a oneDNN graph (models/inference.inference_threads)."""
    args.omp_threads = inference_threads(graph_mode(args, parse_devices(spec or args.devices)), args.omp_threads)


def graph_mode(args, ctx):
    """The inference graph evaluate or predict runs for ``args`` on ``ctx``."""
    model = args.model or recorded_run(params_in(args.params, args.member))["model"]
    return inference_mode(args.inference, ctx, model, args.fused_conv)


def add_inference_flags(p):
    """--inference, --int8 and --calibration-samples (evaluate and predict)."""
    g = p.group("inference")
    g.add_argument("--inference", choices=tuple(MODES), default="auto",
                   help="the graph to run: " + "; ".join(f"{k}: {v}" for k, v in MODES.items()))
    g.add_argument("--int8", dest="inference", action="store_const", const="int8", help="--inference int8")
    g.add_argument("--calibration-samples", type=positive_int, default=512, metavar="N",
                   help="--int8: training samples that set each layer's INT8 range")


def add_saved_model_flags(p, positional=False):
    """--params (``positional``: the first argument), --model and --member: which saved
    network to load (evaluate, predict, export)."""
    where = {} if positional else {"required": True}
    p.add_argument("params" if positional else "--params", metavar="RUN_DIR|FILE", **where,
                   help="a run folder (its best.params, else net.params) or a parameter file (gluon_gpu's, "
                        "or saved by your own code)")
    p.add_argument("--model", default=None, help="network (default: the one the run recorded, else lenet)")
    p.add_argument("--member", type=non_negative_int, default=None, metavar="K",
                   help="member K of an ensemble or sweep (a run folder: from its net.params), as that network alone")


def recorded_spec(params_path):
    """The DataSpec of the run beside a params file; None for a file without a run
    (then FashionMNIST, the tutorial's data)."""
    data = recorded_run(params_path)["data"]
    return DataSpec.from_dict(data) if data else None


def validation_data(spec, data_dir=None, limit=0, streamed=False):
    """The validation split the run recorded (``data_dir`` overrides where it lives), and
    its first ``limit`` training samples only (0: none; INT8 calibrates on a few hundred):
    an image folder's or RecordIO file's training split is not decoded to evaluate.
    ``streamed``: its validation images stay on disk, read a batch at a time."""
    if spec is None or spec.dataset == "fashion-mnist":
        return load_dataset("fashion-mnist", data_dir, limit=limit)
    size = ",".join(map(str, spec.input_shape[1:])) if spec.dataset == "folder" else None
    data = load_dataset(spec.dataset, data_dir or spec.source, size, spec.task, limit=limit, decoded=False)
    spec.check_compatible(data.spec, f"the data in {data_dir or spec.source}")
    return data.decoded(val=not streamed)


def evaluate_params(path, ctx, model=None, data_dir=None, batch_size=256, fused_conv="auto", member=None,
                    inference="graph", calibration=512, data=None, pipeline="auto", tta=None):
    """``{'loss', <metric>...}`` on the validation split for the parameters in ``path``
    loaded onto ``ctx`` (``member``: that member of an ensemble or sweep alone), run as
    the ``inference`` graph (models/inference.py; ``int8``: calibrated on ``calibration``
    training samples). ``data``: the run's :func:`validation_data`, when already read;
    ``pipeline``: how the training graph takes it (the other graphs read it batch by
    batch on the host)."""
    spec = recorded_spec(path)
    data = data or validation_data(spec, data_dir, calibration if inference == "int8" else 0, streamed=True)
    spec = spec or data.spec
    check_tta(tta, spec.input_shape, spec.task)
    if inference != "graph":
        example = next(iter(sample_batches(data.val_x, batch_size)))[1]
        net = inference_model(path, spec, inference, example, model, member,
                              calibration=data.train_x[:calibration], log=True)
        return evaluate_inference(net, head_for(spec.task, spec.outputs), data.val_x, data.val_y, batch_size,
                                  spec.dtype, tta)
    return graph_evaluation(path, ctx, spec, data.val_x, data.val_y, batch_size, model, fused_conv, member,
                            pipeline, tta)()


def graph_evaluation(path, ctx, spec, x, y, batch_size, model=None, fused_conv="auto", member=None,
                     pipeline="auto", tta=None):
    """``() -> figures``: the training graph's evaluation of the parameters in ``path`` on
    ``ctx`` over samples ``x``, labels ``y`` (the network loaded and the samples placed
    once; the benchmark calls it again and again). ``pipeline`` as ``--pipeline``: auto
    keeps the samples on the devices when a copy fits, else reads them a batch at a time."""
    net = load_model(path, ctx, model, input_shape=spec.input_shape, outputs=spec.outputs, fused_conv=fused_conv,
                     member=member)
    members = member_count(net)
    dp = DataParallel(net, ctx, head=head_for(spec.task, spec.outputs), transform=spec.transform(members), tta=tta)
    eval_ctx = pipeline_layout(net, ctx).eval_ctx  # an ensemble of placed members: its home device
    batches = make_pipeline(pipeline, x, y, batch_size, eval_ctx, shuffle=False, members=members)
    return lambda: dp.evaluate(batches.epoch(0))


def evaluate_inference(net, head, x, y, batch_size, dtype, tta=None):
    """The figures of :func:`evaluate_params` for a Servable giving log-probabilities (or
    predictions), batch by batch on the host; ``tta``: of the mean over each batch's views."""
    sums, tally = None, 0
    for start, batch in sample_batches(x, batch_size):  # summed where computed: one wait, at the end
        out = (tta.host_mean(lambda view: net(nd.array(view, dtype=dtype)), batch) if tta
               else net(nd.array(batch, dtype=dtype)))
        loss, metrics = head.per_sample(nd, out, nd.array(y[start:start + len(batch)]))
        figures = nd.stack(*[v.sum().astype("float64") for v in [loss] + metrics])
        sums = figures if sums is None else sums + figures
        if head.tallied:
            tally = head.predicted(nd, out).sum(axis=0) + tally
    figures = dict(zip(("loss",) + head.names, (sums.asnumpy().reshape(-1) / len(x)).tolist()))
    return {**figures, "samples": len(x), **(head.tally_figures(tally.asnumpy()) if head.tallied else {})}


@main_guard("gluon_gpu.evaluate")
def main(argv=None):
    args = parse_args(build_parser(), argv, adjust=one_dnn_threads)
    args.params = params_in(args.params, args.member)
    run = recorded_run(args.params)
    model = args.model or run["model"]
    tta = parse_tta(args.tta)
    if tta and run["members"] > 1 and args.member is None:
        raise UserError("`tta` evaluates one network: pick a member of this "
                        f"{'sweep' if run['sweep'] else 'ensemble'} with `member`")
    with devices(args.devices) as ctx:
        check_batch(args.batch_size, ctx)
        mode = graph_mode(args, ctx)
        data = validation_data(recorded_spec(args.params), args.data_dir,
                               args.calibration_samples if mode == "int8" else 0, streamed=True)

        def figures_of(graph):  # the data read once, for int8 and its float32 reference
            return evaluate_params(args.params, ctx, model, args.data_dir, args.batch_size, args.fused_conv,
                                   args.member, graph, args.calibration_samples, data, args.pipeline, tta)
        result = figures_of(mode)
        float32 = figures_of("fused") if mode == "int8" else None
    kind = "sweep" if run["sweep"] else "ensemble"
    what = f"{kind} of {run['members']} {model}" if run["members"] > 1 and not args.model else model
    what = f"member {args.member} of the {what}" if args.member is not None else what
    shown = "  ".join(f"{name} {value:.4f}" for name, value in result.items()
                      if name not in COUNTS and not name.startswith("member_"))
    threads = thread_settings()["omp_threads"]  # the process's (a main(argv) call in Python cannot set them)
    cpu = f"{describe([mx.cpu()])}, {threads} OpenMP thread{'s' * (threads > 1)}"
    where = describe(ctx) if mode == "graph" else cpu
    classes = result.get("predicted_classes")
    predicted = "" if classes is None else f", {classes} class{'es' * (classes != 1)} predicted"
    print(f"{args.params}: {what} validation {shown} on {where} ({result['samples']} samples{predicted}, "
          f"{mode} inference{', tta ' + tta.spelled() if tta else ''})")
    if float32:
        change = "  ".join(f"{name} {float32[name]:.4f} ({result[name] - float32[name]:+.4f})" for name in float32
                           if name not in COUNTS + ("loss",))
        print(f"int8 against float32 (fused): {change}")
    return 0
