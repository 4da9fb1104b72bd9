"""hmct-debugger: the accuracy debugger (``hbtools.debug``) on the command line.

List arguments are Python literals (``-q "['Conv_2','Conv_90']"``); the shell's
quote removal is tolerated (``-m [cosine-similarity,mse]``) and so is a list split
at spaces (``-q ['weight', 'activation']``). Booleans are ``True`` / ``False``.
Sub-commands may be written with ``_`` for ``-``.
"""

from __future__ import annotations

import ast
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from hbtools import __version__
from hbtools.cli.common import ToolGroup, reports_errors
from hbtools.errors import UsageError
from hbtools.log import setup

log = logging.getLogger("hbtools")
LOG_FILE = "hmct_debugger.log"
# A quoted string (kept) or a bare word (to be quoted) inside a list literal.
_WORD = re.compile(r"""('[^']*'|"[^"]*")|([^\[\],\s'"]+)""")


class PyValue(click.ParamType):
    """A Python literal (list, nested list, string); anything else is kept as a string."""

    name = "value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            pass
        else:
            # Every such option takes names: a bare number is a node's name (PyTorch and Caffe exports name
            # nodes 103, 104, ...), as in a list.
            return _named(parsed) if isinstance(parsed, list | tuple) else parsed if isinstance(parsed, str) else text
        if text.startswith("[") and text.count("[") > text.count("]"):
            self.fail(f"{value!r} is an unterminated list (no closing ']'); write it as \"['name1','name2']\"",
                      param, ctx)
        if text.startswith("["):
            try:  # the shell removed the quotes: [a,b] or [[a],[b,c]]
                return ast.literal_eval(_WORD.sub(lambda m: m.group(1) or repr(m.group(2)), text))
            except (ValueError, SyntaxError):
                self.fail(f"{value!r} is not a list; write it as \"['name1','name2']\"", param, ctx)
        return text


def _named(value: Any) -> Any:
    """Numbers in a (nested) list of names as the names they spell."""
    if isinstance(value, list | tuple):
        return [_named(v) for v in value]
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


VALUE = PyValue()


class DebuggerCommand(click.Command):
    """Opens the log file when it runs: ``--help`` (handled while click parses) leaves no empty log behind."""

    def invoke(self, ctx: click.Context) -> Any:
        setup(LOG_FILE, call=ctx.find_root().command.call)  # type: ignore[attr-defined]
        return super().invoke(ctx)


class DebuggerGroup(ToolGroup):
    """Its log keeps every call's lines after a header naming the call: each call asks its own question, and the
    next one in the folder replaced a failing call's traceback."""

    command_class = DebuggerCommand

    def main(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        self.call = ["hmct-debugger", *(sys.argv[1:] if args is None else args)]
        return super().main(args, *rest, **kwargs)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name.replace("_", "-"))


@click.group(cls=DebuggerGroup, log_file=LOG_FILE, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hmct-debugger")
def cli() -> None:
    """Find the nodes of a calibrated model that cost accuracy.

    Each command takes the calibrated model (*_calibrated_model.onnx) and the
    calibration_data folder written with debug_mode: 'dump_calibration_data'.
    """


def _model_and_data(fn: Callable) -> Callable:
    fn = click.argument("calibration_data", metavar="CALIBRATION_DATA")(fn)
    return click.argument("model_or_file", metavar="MODEL_OR_FILE")(fn)


def _option(short: str, name: str, **kwargs: Any) -> Callable:
    """The vendor's short flag plus the API parameter's name as the long one (with '-' for '_' too, as the other
    tools spell their long options)."""
    hyphens = [f"--{name.replace('_', '-')}"] if "_" in name else []
    return click.option(short, f"--{name}", *hyphens, name, **kwargs)


@cli.command("get-sensitivity-of-nodes")
@_model_and_data
@_option("-m", "metrics", type=VALUE, default="cosine-similarity", show_default=True,
         help="Metric or list of metrics; the first one ranks.")
@_option("-o", "output_node", help="Measure at this node's output instead of the model outputs.")
@_option("-n", "node_type", default="node", show_default=True, help="node, weight or activation.")
@_option("-d", "data_num", type=int, help="Number of samples (default: all).")
@_option("-v", "verbose", type=click.BOOL, default=False, show_default=True, help="Print the table.")
@_option("-i", "interested_nodes", type=VALUE, help="Only these nodes (overrides -n).")
def get_sensitivity_of_nodes(model_or_file: str, calibration_data: str, **kwargs: Any) -> None:
    """Rank nodes by the output error their quantization alone causes."""
    from hbtools.debug import get_sensitivity_of_nodes as run

    result = run(model_or_file=model_or_file, calibrated_data=calibration_data, **kwargs)
    if result and not kwargs["verbose"]:
        name, values = next(iter(result.items()))
        log.info("%d nodes ranked; most sensitive: %s %s (-v True prints the table)", len(result), name, values)


@cli.command("plot-acc-error")
@_model_and_data
@_option("-s", "save_dir", help="Folder for the plot (default ./debug_result).")
@_option("-q", "quantize_node", type=VALUE, help="Nodes to quantize alone: names, lists, 'weight', 'activation'.")
@_option("-nq", "non_quantize_node", type=VALUE, help="Nodes to leave float, everything else quantized.")
@_option("-m", "metric", default="cosine-similarity", show_default=True, help="Error metric.")
@_option("-a", "average_mode", type=click.BOOL, default=False, show_default=True, help="Plot the running mean.")
def plot_acc_error(model_or_file: str, calibration_data: str, **kwargs: Any) -> None:
    """Error of every node's output along the graph for partly quantized models."""
    from hbtools.debug import plot_acc_error as run

    run(model_or_file=model_or_file, calibrated_data=calibration_data, **kwargs)


@cli.command("plot-distribution")
@_model_and_data
@_option("-s", "save_dir", help="Folder for the plots (default ./debug_result).")
@_option("-n", "nodes_list", type=VALUE, required=True, help="Nodes to plot (any kind).")
def plot_distribution(model_or_file: str, calibration_data: str, **kwargs: Any) -> None:
    """Histograms of nodes' data in the float and the calibrated model."""
    from hbtools.debug import plot_distribution as run

    run(model_or_file=model_or_file, calibrated_data=calibration_data, **kwargs)


@cli.command("get-channelwise-data-distribution")
@_model_and_data
@_option("-s", "save_dir", help="Folder for the plots (default ./debug_result).")
@_option("-n", "nodes_list", type=VALUE, required=True, help="Calibration nodes to plot.")
@_option("-a", "axis", type=int, help="Channel axis (default: weight's own axis, 1 for activations).")
def get_channelwise_data_distribution(model_or_file: str, calibration_data: str, **kwargs: Any) -> None:
    """Per-channel box plots of calibration nodes' input."""
    from hbtools.debug import get_channelwise_data_distribution as run

    run(model_or_file=model_or_file, calibrated_data=calibration_data, **kwargs)


@cli.command("sensitivity-analysis")
@_model_and_data
@_option("-p", "pick_threshold", type=float, default=0.999, show_default=True,
         help="Nodes with a lower output cosine are sensitive.")
@_option("-d", "data_num", type=int, default=1, show_default=True, help="Number of samples.")
@_option("-sn", "sensitive_nodes", type=VALUE, help="Analyse these nodes instead of picking.")
@_option("-sd", "save_dir", help="Folder for the chart (default ./debug_result).")
def sensitivity_analysis(model_or_file: str, calibration_data: str, **kwargs: Any) -> None:
    """Sensitive nodes quantized alone and un-quantized cumulatively."""
    from hbtools.debug import sensitivity_analysis as run

    run(model_or_file=model_or_file, calibrated_data=calibration_data, **kwargs)


@cli.command("runall")
@_model_and_data
@_option("-s", "save_dir", help="Folder for all results (default ./debug_result).")
@_option("-nm", "ns_metrics", type=VALUE, default="cosine-similarity", show_default=True,
         help="Sensitivity metric(s).")
@_option("-o", "output_node", help="Measure sensitivity at this node's output.")
@_option("-nt", "node_type", help="node, weight or activation (default: weight and activation).")
@_option("-dn", "data_num", type=int, help="Number of samples (default: all).")
@_option("-v", "verbose", type=click.BOOL, default=False, show_default=True, help="Print the tables.")
@_option("-i", "interested_nodes", type=VALUE, help="Only rank these nodes.")
@_option("-dnl", "dis_nodes_list", type=VALUE, help="Nodes for the distribution plots.")
@_option("-cn", "cw_nodes_list", type=VALUE, help="Calibration nodes for the box plots.")
@_option("-a", "axis", type=int, help="Channel axis of the box plots.")
@_option("-qn", "quantize_node", type=VALUE, help="Accumulated error: nodes to quantize alone.")
@_option("-nqn", "non_quantize_node", type=VALUE, help="Accumulated error: nodes to leave float.")
@_option("-am", "ae_metric", default="cosine-similarity", show_default=True, help="Accumulated error metric.")
@_option("-avm", "average_mode", type=click.BOOL, default=False, show_default=True,
         help="Accumulated error as running mean.")
@_option("-pt", "pick_threshold", type=float, default=0.999, show_default=True,
         help="Sensitivity analysis threshold.")
@_option("-sn", "sensitive_nodes", type=VALUE, help="Sensitivity analysis nodes.")
def runall(model_or_file: str, calibration_data: str, **kwargs: Any) -> None:
    """Every analysis in one go; results under the save folder."""
    from hbtools.debug import runall as run

    run(model_or_file=model_or_file, calibrated_data=calibration_data, **kwargs)


# An option token (-s, --save_dir), not a negative number inside a list (``[1,`` ``-2]``).
_OPTION = re.compile(r"--?[A-Za-z]")


def join_split_lists(args: Sequence[str]) -> list[str]:
    """Re-join a list argument the shell split at spaces: ``['a',`` ``'b']`` -> ``['a', 'b']``.

    A list never closed stops at the next option, which stays an option: ``-q "[Conv_0" -s ae6`` keeps
    ``-s ae6`` (PyValue then reports the list as unterminated).
    """
    out: list[str] = []
    depth = 0
    for arg in args:
        if depth > 0 and _OPTION.match(arg):
            depth = 0
        if depth > 0:
            out[-1] += " " + arg
        else:
            out.append(arg)
        if depth > 0 or arg.startswith("["):
            depth = out[-1].count("[") - out[-1].count("]")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = join_split_lists(sys.argv[1:] if argv is None else argv)
    setup(None)  # the console until a command runs (DebuggerCommand) or click reports a usage error (ToolGroup)
    if not args:
        click.echo(cli.get_help(click.Context(cli, info_name="hmct-debugger")))
        return
    code = _run(args)
    if isinstance(code, int) and code:
        sys.exit(code)


@reports_errors("hmct-debugger", single_line=True)
def _run(args: list[str]) -> object:
    """Usage mistakes caught by click become ERROR lines like the debugger's own."""
    try:
        return cli.main(args=args, prog_name="hmct-debugger", standalone_mode=False)
    except click.exceptions.UsageError as exc:
        raise UsageError(f"{exc.format_message()} (see hmct-debugger {' '.join(args[:1])} --help)") from exc
    except click.exceptions.Abort as exc:
        raise KeyboardInterrupt from exc


if __name__ == "__main__":
    main()
