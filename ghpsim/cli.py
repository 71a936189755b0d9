"""The `ghpsim` command line: every command of the product, the simulator's and the validator's.

Parsing needs argparse alone (`ghpsim.arguments`). A command's module is imported only when that
command runs, so `ghpsim --help` is instant and the validator's commands (torch) load only when
called: `ghpsim demo` and `ghpsim simulate` run without torch. Bad input: one line on stderr, exit
code 2, no traceback; that is decided here, in `main`, for every command, running out of memory
included (one line naming the command and its file). The line is made terminal-safe
(`simulator.errors.one_line`: control characters escaped, at most 300 characters).
"""

from __future__ import annotations

import sys

INTERRUPTED = "ghpsim: interrupted"
EXIT_INTERRUPTED = 130
"""A Ctrl-C, whenever it comes (this module loading included): this line on stderr, exit code 130."""

try:
    import argparse
    import importlib
    import os
    import re
    import signal
    import threading

    from ghpsim import arguments
except KeyboardInterrupt:  # `ghpsim` and `python -m ghpsim` import this module before `main` runs
    print(INTERRUPTED, file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)

DESCRIPTION = ("Simulate distributed DNN training on GPU clusters. "
               "Bad input: one line on stderr, exit code 2, no traceback.")
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13
"""The reader of stdout went away (`ghpsim ... | head -1`): the shell's code for a process ended by
SIGPIPE, so a script tells it from a failed command (1)."""

COMMANDS = {  # name: (what runs it, "module:function" taking the parsed args; one-line help; its arguments)
    "demo": ("ghpsim.simulation_commands:cmd_demo", "GHP vs DP vs MP on the embedded default scenario",
             arguments.demo),
    "simulate": ("ghpsim.simulation_commands:cmd_simulate", "simulate one training step of a scenario",
                 arguments.simulate),
    "compare": ("ghpsim.simulation_commands:cmd_compare", "simulate several strategies, sorted by step time (those that fit first)",
                arguments.compare),
    "list": ("ghpsim.simulation_commands:cmd_list", "list presets: gpus, links or models", arguments.listing),
    "rank": ("simulator.rank_cli:run", "rank every parallel layout for N GPUs, simulating those that can still win",
             arguments.rank),
    "report": ("simulator.report.command:run", "an HTML + Markdown report of a scenario or a result file",
               arguments.report),
    "sweep": ("simulator.sweep.command:run",
              "simulate every point of a sweep file, in parallel, into a crash-safe store", arguments.sweep),
    "schedule": ("simulator.schedule_cli:run", "print a pipeline schedule as a grid of ranks x time slots",
                 arguments.schedule),
    "search": ("simulator.pase.cli:run", "PaSE strategy search vs data parallelism and the expert strategy",
               arguments.search),
    "gallery": ("simulator.report.gallery:run",
                "regenerate the seed-paper gallery (one report per paper + index)", arguments.gallery),
    "partition": ("simulator.partition_cli:run", "PipeDream's partition (stages x replicas) of a scenario's model",
                  arguments.partition),
    "merge-profiles": ("simulator.profile_merge:run", "pool calibrations taken at different times into one profile",
                       arguments.merge_profiles),
    "fit": ("simulator.fit_command:run", "fit the GPU kernel model's physical parameters to measured step times",
            arguments.fit),
    "calibrate": ("ghpsim.validator_commands:cmd_calibrate", "microbenchmark this machine into a cost profile",
                  arguments.calibrate),
    "validate": ("ghpsim.validator_commands:cmd_validate", "run plans for real and compare with the prediction",
                 arguments.validate),
    "import-model": ("ghpsim.validator_commands:cmd_import_model", "trace a torch.nn.Module into a layer table",
                     arguments.import_model),
}

USER_ERRORS = ("simulator.errors:ScenarioError", "simulator.errors:SimulationError", "validator.errors:RankFailure")
"""Exceptions that report bad input (or a failed real run), not a bug: one line, exit 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the product's rule for bad input), exit 2; an
    argument no one took is reported by the command's own parser (`subcommands`), pointing to its
    --help, and a value that begins with '-' (read as an option) gets a hint to write FLAG=VALUE."""

    subcommands: dict = {}
    """Command name -> its parser (`build_parser`)."""

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)  # for `_dash_value_hint`
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.subcommands.get(getattr(parsed, "command", None), self)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def error(self, message: str):
        hint = _dash_value_hint(message, getattr(self, "_given", []))
        self.exit(EXIT_USAGE, one_line(f"{self.prog}: error: {message}{hint} (see {self.prog} --help)") + "\n")


def _dash_value_hint(message: str, given: list[str]) -> str:
    """For argparse's "argument --flag: expected one argument" where the word after --flag in `given`
    begins with '-' (argparse takes -3,8,8 for an option): the value and how to pass it."""
    match = re.fullmatch(r"argument (\S+): expected one argument", message)
    for flag in match.group(1).split("/") if match else ():
        if flag in given[:-1] and given[given.index(flag) + 1].startswith("-"):
            value = given[given.index(flag) + 1]
            return f" (got {value!r}, which begins with '-' and reads as an option: write {flag}={value})"
    return ""


class _VersionAction(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked ("unknown" when
    run from a checkout without installing it)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version
        try:
            found = version("ghpsim")
        except PackageNotFoundError:
            found = "unknown"
        print(f"ghpsim {found}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ghpsim", description=DESCRIPTION)
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.subcommands = {}
    for name, (_target, help_text, add_arguments) in COMMANDS.items():
        parser.subcommands[name] = commands.add_parser(name, help=help_text)
        add_arguments(parser.subcommands[name])
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default sys.argv[1:]) and run the command; return its exit code."""
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    if getattr(args, "profile", None) == "":  # else "no profile" on some commands, "." on others
        print("ghpsim: error: --profile: needs a file name (got '')", file=sys.stderr)
        return EXIT_USAGE
    with first_interrupt_only() as interrupt:
        code = _run(args)
    if interrupt.signal_number is not None and code == EXIT_INTERRUPTED:
        return 128 + interrupt.signal_number
    return code


def _run(args: argparse.Namespace) -> int:
    """`args.command` run, its user errors, interrupt and running out of memory reported in one line."""
    try:
        return load(COMMANDS[args.command][0])(args)
    except MemoryError:
        pass  # reported below, once this block has let go of the traceback (and the memory it holds)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""  # none for a write to stdout (a full disk)
        print(one_line(f"ghpsim: error: {where}{error.strerror or error}"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "torch":
            raise
        print(f"ghpsim: error: {args.command} needs torch (pip install 'ghpsim[validator]')", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:
        if not isinstance(error, tuple(map(load, USER_ERRORS))):
            raise
        print(one_line(f"ghpsim: error: {error}"), file=sys.stderr)
        return EXIT_USAGE
    print(one_line(f"ghpsim: error: ran out of memory running {out_of_memory_task(args)}; "
                   "try a smaller model, batch or cluster"), file=sys.stderr)
    return EXIT_USAGE


STOP_SIGNALS = ("SIGTERM", "SIGHUP")
"""Signals that stop a run as Ctrl-C does (a scheduler's or `timeout`'s SIGTERM, a closed terminal's
SIGHUP): the same clean-up and line, and exit code 128 + the signal's number."""


class first_interrupt_only:
    """For the command's run: the first Ctrl-C (or `STOP_SIGNALS`) raises KeyboardInterrupt as usual
    and every later one is ignored, so a second cannot cut short the clean-up that stops the ranks
    and keeps what was measured, nor kill the interpreter while it exits; `signal_number` is the
    stop signal that came, if any. The previous handlers are restored unless one came (the process
    is then ending). A forked child (a worker pool's) that inherited the handler dies of the signal
    as it would have. A no-op outside the main thread, and for each signal whose handler is not the
    default one (a shell's background job ignores SIGINT)."""

    def __enter__(self):
        self.signal_number, self.interrupted, self.pid = None, False, os.getpid()
        main_thread = threading.current_thread() is threading.main_thread()
        defaults = {signal.SIGINT: signal.default_int_handler,
                    **{getattr(signal, name): signal.SIG_DFL for name in STOP_SIGNALS if hasattr(signal, name)}}
        self.installed = [number for number, default in defaults.items()
                          if main_thread and signal.getsignal(number) is default]
        self.defaults = defaults
        for number in self.installed:
            signal.signal(number, self._interrupt)
        return self

    def _interrupt(self, signum, frame):
        if os.getpid() != self.pid:  # a forked worker: the signal's own effect
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.interrupted = True
        self.signal_number = None if signum == signal.SIGINT else signum
        for number in self.installed:
            signal.signal(number, signal.SIG_IGN)
        raise KeyboardInterrupt

    def __exit__(self, *exc_info):
        if not self.interrupted:
            for number in self.installed:
                signal.signal(number, self.defaults[number])
        return False


def out_of_memory_task(args: argparse.Namespace) -> str:
    """What ran out of memory, for its one-line error: the command and the file it was given."""
    subject = next((getattr(args, name) for name in ("scenario", "sweep", "input", "runs", "target")
                    if isinstance(getattr(args, name, None), str)), None)
    return f"`ghpsim {args.command}`" + (f" on {subject}" if subject else "")


def one_line(text: str) -> str:
    """`simulator.errors.one_line`, imported only when an error is printed (the parser stays light)."""
    from simulator.errors import one_line as safe_line
    return safe_line(text)


def load(target: str):
    """The object named by "package.module:name", its module imported now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
