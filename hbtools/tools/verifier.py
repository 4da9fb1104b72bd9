"""hb_verifier logic: the quantized ONNX (HB_ONNXRuntime) against the ``.bin`` (simulator).

Both get the same input: the runtime data goes through the device's input path
once (``Simulator.prepare``) and the resulting model-input tensors feed the ONNX
model, so any difference comes from the two implementations of the graph.
Outputs are matched by tensor name; a ``.bin`` whose output-side nodes were
removed by hb_model_modifier is compared on the tensors that became its outputs
(they keep the deleted node's output name; ``modifier.original_tensor`` maps back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import ModelProto, helper

from hbtools.config.values import closest_names
from hbtools.errors import HbError
from hbtools.graph.model_io import load_model
from hbtools.ops.base import DOMAIN
from hbtools.ops.calibration import HzBiasCalibration, HzCalibration
from hbtools.ops.preprocess import HzPreprocess
from hbtools.outputs import file_names, replace_atomically
from hbtools.runs.transaction import Destination, artefact_transaction
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.rt_input import load_rt_file, random_rt_inputs
from hbtools.runtime.runtime_model import RuntimeModel, load
from hbtools.runtime.session import HB_ONNXRuntime, with_outputs
from hbtools.runtime.simulator import Simulator
from hbtools.tools.modifier import original_tensor, without_input_side

RANDOM_SEED = 0  # random inputs are the same in every run, so a failure can be reproduced
DUMP_SIDES = ("quanti_onnx", "sim")  # the dump's folders: the quantized model's tensors, the simulator's
DUMP_FOLDER = Destination("the hb_verifier dump folder", "run hb_verifier from another folder (it writes "
                                                         "hb_verifier_dump/ in the current folder)")


@dataclass
class Comparison:
    name: str
    total: int
    miss: int  # elements present in one result only
    diff: int  # elements further apart than the tolerance
    nan: int  # elements that are NaN in one result only
    max_abs: float
    max_rel: float  # largest |a - b| / max(|a|, |b|) over the mismatching elements

    @property
    def mismatch(self) -> int:
        return self.miss + self.diff + self.nan

    @property
    def rate(self) -> float:
        return self.mismatch / self.total if self.total else 0.0

    @property
    def passed(self) -> bool:
        return self.mismatch == 0


def compare(name: str, expected: np.ndarray, actual: np.ndarray, digits: int) -> Comparison:
    """Element-wise comparison to ``digits`` decimals: |a - b| < 1.5 * 10**-digits (numpy's rule)."""
    a = np.asarray(expected).reshape(-1)
    b = np.asarray(actual).reshape(-1)
    n = min(a.size, b.size)
    a64, b64 = a[:n].astype(np.float64), b[:n].astype(np.float64)
    # NaN on one side only is a mismatch; NaN on both (a CPU op that gives NaN in either model) and
    # equal infinities agree.
    nan = np.isnan(a64) != np.isnan(b64)
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite
        err = np.where(np.isnan(a64) | np.isnan(b64) | (a64 == b64), 0.0, np.abs(a64 - b64))
    differs = (err >= 1.5 * 10.0**-digits) & ~nan
    # Relative to the larger of the two values, over the elements that mismatch: at most 2 (opposite
    # signs), 1 where one side is 0; a near-zero expected value no longer divides into ~1e305.
    rel = np.where(differs, err / np.maximum(np.maximum(np.abs(a64), np.abs(b64)), np.finfo(np.float64).tiny), 0.0)
    return Comparison(name, max(a.size, b.size), abs(a.size - b.size), int(differs.sum()), int(nan.sum()),
                      float(err.max()) if n else 0.0, float(rel.max()) if n else 0.0)


def open_for_verify(bin_path: str | Path) -> RuntimeModel:
    f = read_bin(bin_path)
    if f.packed:
        raise HbError("pack model is not supported")
    return load(f.models[0], f.path)


def runtime_inputs(rm: RuntimeModel, images: list[str] | None) -> dict[str, np.ndarray]:
    """Runtime data per input from ``name:path`` or positional paths; random data when none are given."""
    rng = np.random.default_rng(RANDOM_SEED)
    if not images:
        return random_rt_inputs(rm, rng)
    names = [d.name for d in rm.inputs]
    given: dict[str, str] = {}
    for k, item in enumerate(images):
        # the longest input name the item starts with: tf2onnx names inputs 'input_1:0'
        name = max((n for n in names if item.startswith(n + ":")), key=len, default=None)
        if name is not None:
            sep, path = ":", item[len(name) + 1:]
        else:
            name, sep, path = item.partition(":")
        if sep and name in names:
            given[name] = path
        elif sep and not Path(item).exists():  # 'name:file' with a name the model lacks (not a path with ':')
            raise HbError(f"-i names input '{name}', which the model does not have"
                          f"{closest_names(name, names)}; its inputs are {names}")
        elif k < len(names):
            given[names[k]] = item
        else:
            raise HbError(f"more input files than model inputs ({names})")
    missing = [n for n in names if n not in given]
    if missing:
        raise HbError(f"no input file for {missing}", hint="give one file per input: name1:file1,name2:file2")
    descs = {d.name: d for d in rm.inputs}
    return {n: load_rt_file(descs[n], p) for n, p in given.items()}


def given_files(images: list[str] | None) -> list[Path]:
    """The existing files ``-i`` items name, read before the model is: an item is a path, or 'name:path' with
    a name that may hold ':' itself."""
    files = []
    for item in images or []:
        starts = [0, *(k + 1 for k, c in enumerate(item) if c == ":")]
        files += [Path(item[k:]) for k in starts if item[k:] and Path(item[k:]).exists()]
    return files


def _with_outputs(model: ModelProto, names: list[str]) -> ModelProto:
    """The quantized model with ``names`` as graph outputs (tensors a modified .bin exposes)."""
    produced = {o.name for o in model.graph.output} | {o for n in model.graph.node for o in n.output}
    for name in names:
        if name not in produced:
            raise HbError(f"the .bin output '{name}' is not a tensor of the quantized model; "
                          f"were the two built by the same makertbin run?")
    return with_outputs(model, names)


def _check_is_quantized(model: ModelProto, onnx_path: str | Path, rm: RuntimeModel) -> None:
    """A calibrated or float artefact given as the quantized model: say which file -m wants, not that the
    inputs differ (they do: the quantized model has its preprocessing folded in)."""
    def horizon_ops(graph: ModelProto) -> set[str]:
        return {n.op_type for n in graph.graph.node if n.domain == DOMAIN}

    ops = horizon_ops(model)
    if ops & {HzCalibration.op_type, HzBiasCalibration.op_type}:
        kind = "a calibrated model (it holds HzCalibration nodes)"
    elif not ops - {HzPreprocess.op_type} and horizon_ops(rm.bin.load_graph()) - {HzPreprocess.op_type}:
        kind = "a float model (it holds no quantized nodes, the .bin does)"
    else:
        return
    raise HbError(f"'{onnx_path}' is {kind}, not the quantized model",
                  hint="-m takes the *_quantized_model.onnx and the .bin that the same makertbin run wrote: "
                       "-m model_quantized_model.onnx,model.bin")


def _check_same_inputs(quantized: ModelProto, rm: RuntimeModel) -> None:
    inits = {t.name for t in quantized.graph.initializer}
    onnx_inputs = {}
    for vi in quantized.graph.input:
        if vi.name not in inits:
            t = vi.type.tensor_type
            onnx_inputs[vi.name] = (t.elem_type, tuple(d.dim_value for d in t.shape.dim))
    # a batch-N .bin holds the quantized model's batch-1 graph
    bin_inputs = {d.name: (helper.np_dtype_to_tensor_dtype(d.dtype),
                           (d.shape[0] // rm.batch, *d.shape[1:]) if d.shape else ()) for d in rm.inputs}
    if onnx_inputs != bin_inputs:
        raise HbError(f"the quantized model's inputs {onnx_inputs} differ from the .bin's {bin_inputs} "
                      f"(name: (ONNX type, shape)); were the two built by the same makertbin run?")


@dataclass
class Verification:
    outputs: list[Comparison]  # model outputs
    nodes: list[Comparison]  # every shared intermediate tensor (dump_all only)
    onnx_values: dict[str, np.ndarray]
    sim_values: dict[str, np.ndarray]
    other_weights: list[str] = field(default_factory=list)  # constants that differ between the two models


def differing_constants(quantized: ModelProto, rm: RuntimeModel) -> list[str]:
    """Initializers both models have under one name but with other values: the .bin then holds another
    build's quantized model (another calibration, other weights), not the one given."""
    ours = {t.name: t for t in rm.graph.graph.initializer}
    return [t.name for t in quantized.graph.initializer
            if t.name in ours and t.SerializeToString() != ours[t.name].SerializeToString()]


def verify(onnx_path: str | Path, bin_path: str | Path, images: list[str] | None, digits: int,
           dump_all: bool = False) -> Verification:
    rm = open_for_verify(bin_path)
    quantized = load_model(onnx_path)
    _check_is_quantized(quantized, onnx_path, rm)
    # Nodes hb_model_modifier removed at the inputs (a Quantize, a layout Transpose): the .bin takes what they
    # gave, so the quantized model is compared from there too.
    quantized = without_input_side(quantized, rm.bin.deleted_nodes)
    _check_same_inputs(quantized, rm)
    sim = Simulator(rm, expose_all=dump_all)
    feeds = sim.prepare(runtime_inputs(rm, images))
    try:
        sim_values = sim.run_all(feeds, prepared=True)
    except HbError as e:
        if images:
            raise
        # Random data fits any float input, but not every integer one (a size, an index into a computed table).
        files = ",".join(f"{d.name}:{d.name}.npy" for d in rm.inputs)
        raise HbError(str(e), hint=f"hb_verifier ran on random data (no -i); give data the model takes, one file "
                                   f"per input: -i {files}") from None
    output_names = [o.name for o in rm.outputs]
    # .bin tensor name -> the quantized model's name for the same values
    onnx_name = {n: original_tensor(rm.bin, n) for n in output_names}
    shared = output_names
    if dump_all:
        produced = {o for n in quantized.graph.node for o in n.output}
        renamed = set(onnx_name.values()) - set(output_names)
        shared = list(dict.fromkeys([*output_names, *(t for t in sim_values if t in produced and t not in renamed)]))
    wanted = [onnx_name.get(n, n) for n in shared]
    session = HB_ONNXRuntime(onnx_model=_with_outputs(quantized, wanted))
    # Item i of a batched .bin is rows i*d..(i+1)*d of each input, d being the graph's own first
    # dimension (not always 1: Silero VAD's state input is 2x1x128).
    parts = {k: np.split(v, rm.batch) if rm.batch > 1 else [v] for k, v in feeds.items()}
    items = [session.run(wanted, {k: p[i] for k, p in parts.items()}) for i in range(rm.batch)]
    onnx_values = {name: np.concatenate([item[k].reshape(1) if item[k].ndim == 0 else item[k] for item in items])
                   if rm.batch > 1 else items[0][k] for k, name in enumerate(shared)}
    outputs = [compare(n, onnx_values[n], sim_values[n], digits) for n in output_names]
    nodes = [compare(n, onnx_values[n], sim_values[n], digits) for n in shared] if dump_all else []
    return Verification(outputs, nodes, onnx_values, {n: sim_values[n] for n in shared},
                        differing_constants(quantized, rm))


def save_dumps(result: Verification, folder: Path, inputs: Sequence[Path] = ()) -> Path:
    """Every compared tensor of both runs as .npy under ``folder/{quanti_onnx,sim}``.

    The dump is one set: it replaces the previous one whole (no tensor of another model stays), and a failed or
    interrupted run leaves the previous one as it was. ``inputs``: the run's files, which it never replaces.
    """
    files = file_names([*result.onnx_values, *result.sim_values], suffix=".npy")
    with artefact_transaction(folder, set_name="hb_verifier", inputs=inputs, folder=DUMP_FOLDER) as staging:
        for side, values in zip(DUMP_SIDES, (result.onnx_values, result.sim_values), strict=True):
            (staging / side).mkdir()
            for name, value in values.items():
                replace_atomically(staging / side / files[name], lambda fh, v=value: np.save(fh, v))
    return folder
