"""python -m gluon_gpu.evaluate: load saved parameters onto any device and report test accuracy."""
import sys

from .cli import add_model_flag, check_batch, main_guard, parse_args, parser
from .data import DevicePipeline, find_data_dir, load_split
from .devices import describe, devices
from .models import load_model, recorded_model
from .parallel import DataParallel


def build_parser():
    p = parser("gluon_gpu.evaluate", __doc__)
    p.add_argument("--params", required=True, help="a net.params file written by gluon_gpu.train")
    add_model_flag(p, default=None)
    return p


def evaluate_params(path, ctx, model=None, data_dir=None, batch_size=256, fused_conv="auto"):
    """Test-set accuracy of the parameters in ``path`` loaded onto ``ctx``."""
    net = load_model(path, ctx, model, fused_conv=fused_conv)
    test_x, test_y = load_split("test", find_data_dir(data_dir, "test"))
    dp = DataParallel(net, ctx, normalize_in_graph=True)
    members = getattr(net, "members", 1)
    return dp.evaluate(DevicePipeline(test_x, test_y, batch_size, ctx, shuffle=False,
                                      members=members).epoch(0))


@main_guard("gluon_gpu.evaluate")
def main(argv=None):
    args = parse_args(build_parser(), argv)
    model, members = recorded_model(args.params)
    model = args.model or model
    with devices(args.devices) as ctx:
        check_batch(args.batch_size, ctx)
        acc = evaluate_params(args.params, ctx, model, args.data_dir, args.batch_size, args.fused_conv)
    what = f"ensemble of {members} {model}" if members > 1 and not args.model else model
    print(f"{args.params}: {what} test accuracy {acc:.4f} on {describe(ctx)} (10000 images)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
