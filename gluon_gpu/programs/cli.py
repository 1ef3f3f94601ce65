"""What every command line shares: common flags, value checks, and turning UserError
into one line on stderr with exit status 2."""
import argparse
import functools
import os
import re
import shlex
import shutil
import sys
from typing import NamedTuple

from ..core.platform.errors import ChildFailed, DeadlineError, ProcessDied, UserError
from ..core.platform.signals import Stopped


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help as a person reads it: the description and examples as written, each flag's
    default after its help (none for flags off by default or without a value)."""

    def _get_help_string(self, action):
        text = action.help or ""
        off = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if not off and action.option_strings and "%(default)" not in text:
            default = " ".join(map(str, action.default)) if isinstance(action.default, list) else action.default
            shown = str(default).replace("%", "%%") or "''"
            text += f" (default: {shown})"
        return text


def invoked_as(program):
    """How the user started ``program``: ``python -m gluon_gpu.train`` from ``-m``, else the
    console script's name (``gluon-gpu-train``; also for a caller in Python)."""
    if os.path.basename(sys.argv[0]) == f"{program}.py" and "-m" in getattr(sys, "orig_argv", ()):
        return f"python -m gluon_gpu.{program}"
    return f"gluon-gpu-{program}"


class _HelpAll(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help(full=True)
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (exit 2) tagged ``gluon_gpu.<program>``,
    not usage plus error; help with defaults, flags in named groups (``group``), docstrings'
    ``markup`` plain, the program named as invoked. With ``brief=True``, --help lists only
    the flags in ``self.brief`` (destination -> a shorter help, or None for the whole
    one), the ones most runs use, and --help-all every flag."""

    def __init__(self, program, description=None, brief=False, **kwargs):
        super().__init__(prog=invoked_as(program), description=(description or "").replace("``", ""),
                         formatter_class=HelpFormatter, **kwargs)
        self.tag = f"gluon_gpu.{program}"
        self.brief = {"help_all": None} if brief else None
        self._groups = {}
        if brief:
            self.add_argument("--help-all", action=_HelpAll, help="show every flag, not only the ones most runs use")

    def brief_flags(self, *dests):
        """Show these flags (destinations) in the short --help too."""
        self.brief.update(dict.fromkeys(dests))

    def group(self, title):
        """The argument group ``title`` (made on first use): --help lists its flags together."""
        if title not in self._groups:
            self._groups[title] = self.add_argument_group(title)
        return self._groups[title]

    def print_help(self, file=None, full=False):
        self._print_message(self.format_help(full), file or sys.stdout)

    def format_help(self, full=False):
        if full or self.brief is None:
            return super().format_help()
        flags = [a for a in self._actions if a.option_strings and a.dest != "help"]
        saved, groups, usage = [(a, a.help) for a in flags], self._action_groups, self.usage
        for action in flags:
            action.help = (self.brief[action.dest] or action.help) if action.dest in self.brief else argparse.SUPPRESS
        self._action_groups = [g for g in groups if any(a.help != argparse.SUPPRESS for a in g._group_actions)]
        self.usage, description = "%(prog)s [FLAG ...]", self.description
        self.description = (description or "").split("\n\n")[0]  # its first paragraph; --help-all: the whole
        try:
            shown = super().format_help()
        finally:
            self._action_groups, self.usage, self.description = groups, usage, description
            for action, text in saved:
                action.help = text
        return shown.rstrip("\n") + f"\n\nThese are the flags most runs use; --help-all lists all {len(flags)}.\n"

    def error(self, message):
        self.exit(2, f"{self.tag}: error: {message} (see --help)\n")

    def _get_values(self, action, arg_strings):
        """An empty value is refused for every flag and argument (``--out ''`` trained into
        runs/<timestamp>, ``--recipe ''`` ran no recipe, without a word): a flag that can be
        off has its own spelling (none, 0), or is left out; and a value given twice to a
        flag that takes several (not to a list of inputs: predict's images may repeat). A
        command passed on whole (launch's) is the command's own."""
        name = "/".join(action.option_strings) or action.metavar or action.dest
        if action.nargs != argparse.REMAINDER and any(not s.strip() for s in arg_strings):
            self.error(f"{name} is empty: give a value, or leave it out")
        values = super()._get_values(action, arg_strings)
        if action.option_strings and action.nargs in ("+", "*") and isinstance(values, list) \
                and len(set(map(repr, values))) < len(values):  # bench --devices cpu cpu timed it twice
            self.error(f"{name} gives a value twice: give each once")
        return values

    def parse(self, args=None):
        """The command line ``args`` (None: this process's), parsed once, as Flags."""
        values = self.parse_args(args)
        return Flags(values, self._typed)

    def parse_known_args(self, args=None, namespace=None):
        self._typed = self._scan(sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)

    def _scan(self, args):
        """The destinations of the flags in ``args``. A flag given twice (``--lr 0.1 ...
        --lr 0.2``, ``--hybridize ... --no-hybridize``) is one line: argparse keeps the
        last silently. Flags that collect (``append``, ``count``) may repeat; the scan
        ends at ``--`` or at a command this parser passes on whole (``launch``'s)."""
        seen, takes_value, typed = {}, False, set()
        passes_on = any(a.nargs == argparse.REMAINDER for a in self._actions if not a.option_strings)
        for arg in args:
            found = arg != "--" and self._parse_optional(arg)  # pylint: disable=protected-access
            if not found:  # "--", a flag's value, or a positional
                if arg == "--" or (passes_on and not takes_value):
                    break
                takes_value = False
                continue
            action, option, _ = found
            takes_value = action is not None and action.nargs != 0 and "=" not in arg
            typed.update([action.dest] if action is not None else [])
            if action is None or isinstance(action, (argparse._AppendAction, argparse._CountAction)):
                continue
            if action in seen:
                self.error(f"{option} is given twice: give it once" if option == seen[action] else
                           f"{seen[action]} and {option} are both given: give one")
            seen[action] = option
        return frozenset(typed)


class Flags(NamedTuple):
    """A command line parsed once: its values, and the destinations the user typed."""
    values: argparse.Namespace
    typed: frozenset

    def typed_values(self):
        """``{destination: value}`` of the flags the user typed (not the defaults)."""
        return {dest: getattr(self.values, dest) for dest in self.typed}


class Renamed(argparse.Action):
    """A flag with a new name: its old spelling (the last option string) still works and
    says once, on stderr, that it is deprecated."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string == self.option_strings[-1]:
            print(f"{getattr(parser, 'tag', parser.prog)}: warning: {option_string} is deprecated: it is "
                  f"{self.option_strings[0]} now", file=sys.stderr)
        setattr(namespace, self.dest, values)


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


# MXNet's operators take their float parameters as float32: 1e39 is an MXNetError
# ("Invalid Parameter format") at the first update.
FLOAT32_MAX = 3.4028234663852886e38


def positive_float(text):
    value = _number(float, text)
    if not 0 < value <= FLOAT32_MAX:
        raise argparse.ArgumentTypeError(f"must be a positive number up to {FLOAT32_MAX:.4g} (float32), got {text!r}")
    return value


def non_negative_float(text):
    value = _number(float, text)
    if not 0 <= value <= FLOAT32_MAX:
        raise argparse.ArgumentTypeError(f"must be from 0 up to {FLOAT32_MAX:.4g} (float32), got {text!r}")
    return value


def below_one(text):
    """From 0 to below 1, as a momentum must be: heavy-ball SGD converges only below 1 (at 1
    or more the velocity grows without bound: --momentum 5 ended a run at loss 1.6e28)."""
    value = _number(float, text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to below 1, got {text!r}")
    return value


def unit_fraction(text):
    """Above 0 and at most 1, as an accuracy is."""
    value = _number(float, text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text!r}")
    return value


def tta_text(text):
    """--tta: the test-time augmentation as spelled again ('flip,shift=1'), '' for none."""
    from ..core.step.tta import parse_tta
    try:
        tta = parse_tta(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None
    return tta.spelled() if tta else ""


def epoch_list(text):
    """Comma-separated epochs, each a positive whole number, in increasing order: '6,8'
    (normalized). Empty items, zero, negatives and repeats are refused: a schedule at
    epochs 0,-3 trained at a thousandth of the rate from the start."""
    if not text:
        return ""  # none given
    items = text.split(",")
    if any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}: give epochs like 6,8")
    epochs = [_number(int, item.strip()) for item in items]
    if any(e < 1 for e in epochs):
        raise argparse.ArgumentTypeError(f"epochs count from 1, got {text!r}")
    if any(a >= b for a, b in zip(epochs, epochs[1:])):
        raise argparse.ArgumentTypeError(f"epochs must increase, got {text!r}")
    return ",".join(map(str, epochs))


def thread_count(text):
    """A thread count for MXNet's variables at start: 0 (as set) or up to what
    core/platform/environment.py accepts of them."""
    from ..core.platform.environment import whole_numbers
    value = non_negative_int(text)
    _, most, why = whole_numbers()["OMP_NUM_THREADS"]
    if value > most:
        raise argparse.ArgumentTypeError(f"must be from 0 to {most}{why}, got {text!r}")
    return value


def wait_seconds(text):
    """Seconds of a deadline (0: none), at most environment.MAX_WAIT_SECONDS: ``bench
    --timeout 9999999`` was an OverflowError (a wait over about 24.8 days) in the wait."""
    from ..core.platform.environment import MAX_WAIT_SECONDS
    value = non_negative_int(text)
    if value > MAX_WAIT_SECONDS:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_WAIT_SECONDS} seconds (a week), got {text!r}")
    return value


def restart_count(text):
    """A count of restarts or resets, at most what the restarted children take back
    from their variable (environment.MAX_RESTARTS)."""
    from ..core.platform.environment import MAX_RESTARTS
    value = non_negative_int(text)
    if value > MAX_RESTARTS:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_RESTARTS}, got {text!r}")
    return value


def process_count(text):
    """A count of processes this host starts (loader workers): 0 up to
    environment.PROCESSES_PER_CORE a usable CPU; more only thrash the machine."""
    from ..core.platform.environment import PROCESSES_PER_CORE, usable_cpus
    value = non_negative_int(text)
    most = PROCESSES_PER_CORE * usable_cpus()
    if value > most:
        raise argparse.ArgumentTypeError(f"must be from 0 to {most} ({PROCESSES_PER_CORE} per usable CPU, "
                                         f"{usable_cpus()} here), got {text!r}")
    return value


def _number(kind, text):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a {'whole ' if kind is int else ''}number: {text!r}") from None


def parse_args(p, argv=None, adjust=None):
    """Parse ``argv`` (None: the command line) and bring the thread flags into effect;
    MXNet reads them only at start, so the program re-executes itself if they differ
    from its environment (see ``devices.require_thread_settings``). ``adjust(args)``:
    the program's own defaults for them, set before: for a command line only (a caller
    in Python keeps the threads its process has)."""
    args = p.parse_args(argv)
    if adjust and argv is None:
        adjust(args)
    from ..core.platform.devices import require_thread_settings
    require_thread_settings(args.omp_threads, args.engine_threads, restart=argv is None)
    return args


def command(program, *args):
    """The shell command that runs gluon_gpu ``program`` with ``args`` in this very
    environment. Started as a console script (``gluon-gpu-pack``): its sibling
    (``gluon-gpu-train``), by name where the PATH finds that very file, else by its path;
    otherwise this interpreter by its path (the ``python`` on a user's PATH may be one
    without gluon_gpu or MXNet, outside the virtualenv)."""
    started = sys.argv[0] if sys.argv else ""
    if os.path.basename(started).startswith("gluon-gpu-"):
        script = os.path.join(os.path.dirname(os.path.abspath(started)), f"gluon-gpu-{program}")
        found = shutil.which(f"gluon-gpu-{program}")
        head = (f"gluon-gpu-{program}",) if found and os.path.realpath(found) == os.path.realpath(script) else (script,)
    else:
        head = (sys.executable, "-m", f"gluon_gpu.{program}")
    return " ".join(shlex.quote(str(a)) for a in head + args)


def check_batch(batch_size, ctx):
    if batch_size < len(ctx):
        raise UserError(f"`batch_size` {batch_size} is smaller than the {len(ctx)} devices: "
                        "every device needs at least one sample")


def progress_enabled(args):
    """A tqdm bar only for a person watching: stdout is a terminal and no --quiet."""
    return not args.quiet and sys.stdout.isatty()


def as_flags(text):
    """The lower layers name parameters as RunConfig does, in backticks (`data_dir`);
    a command line shows them as its flags (--data-dir)."""
    return re.sub(r"`([a-z][a-z0-9_]*)`", lambda m: "--" + m[1].replace("_", "-"), text)


def main_guard(prog):
    """Decorate a CLI ``main(argv) -> int``: UserError -> 'prog: error: ...' on stderr, exit 2;
    Ctrl-C before the program installed its own handling (start-up, data loading) -> one
    line, exit 130, and SIGTERM or SIGHUP likewise, 143 or 129 (training itself
    checkpoints on them: programs/train.py)."""
    def decorate(main):
        @functools.wraps(main)
        def run(argv=None, **options):
            try:
                return main(argv, **options)
            except SystemExit as e:  # argparse: --help, or a bad flag already reported
                return e.code
            except UserError as e:
                print(f"{prog}: error: {as_flags(str(e))}", file=sys.stderr)
                return 2
            except (ProcessDied, DeadlineError, ChildFailed) as e:  # killed (out of memory), past its deadline, failed
                print(f"{prog}: error: {e}", file=sys.stderr)
                return 1
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return 130
            except Stopped as e:  # SIGTERM or SIGHUP outside training (core/platform/signals.py)
                print(f"{prog}: stopped by {e}", file=sys.stderr)
                return 128 + e.signum
        return run
    return decorate


def text_table(columns, rows, title=None):
    """Fixed-width lines: ``columns`` is ``[(heading, width, cell)]``, ``cell(row)`` a
    string; the first column left-aligned, the others right-aligned; a rule under the
    heading, ``title`` above it."""
    def line(cells):
        return "".join(f"{c:<{w}}"[:w] if i == 0 else f"{c:>{w}}" for i, (c, (_, w, _)) in enumerate(zip(cells, columns)))
    head = line([heading for heading, _, _ in columns])
    lines = ([title] if title else []) + [head, "-" * len(head)]
    return "\n".join(lines + [line([cell(r) for _, _, cell in columns]) for r in rows])
