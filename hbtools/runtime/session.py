"""HB_ONNXRuntime: run plain ONNX models and every hbtools artefact on onnxruntime."""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnxruntime as ort
from onnx import ModelProto, TensorProto, helper, numpy_helper

from hbtools.config.values import closest_names
from hbtools.data.npy import first_inexact_in_float, float32_overflow, integers_fit, nan_warning
from hbtools.errors import HbError
from hbtools.graph import model_io
from hbtools.graph.batch_reshapes import same_outputs
from hbtools.graph.graph import copy_model, is_large
from hbtools.graph.model_io import load_model, serialized
from hbtools.log import logger
from hbtools.ops import custom
from hbtools.runtime.lowering import lower_model, lowered_parts

if TYPE_CHECKING:
    from hbtools.runtime.custom_session import CustomOpSession

_NUMPY_OF_ORT = {
    "tensor(float)": np.float32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(double)": np.float64, "tensor(bool)": np.bool_, "tensor(float16)": np.float16,
    "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64,
    "tensor(string)": np.object_,
}

# What onnxruntime raises when a model cannot run on given inputs (its errors share no base class).
RUN_ERRORS = (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidArgument,
              ort.capi.onnxruntime_pybind11_state.RuntimeException)
# ... and when it cannot build a session for a model at all (an element type no kernel takes, an op it does not have)
LOAD_ERRORS = (ort.capi.onnxruntime_pybind11_state.InvalidGraph, ort.capi.onnxruntime_pybind11_state.NotImplemented)


def make_session(model: ModelProto, *, threads: int = 0, per_node: bool = False, spinning: bool = True,
                 memory_pattern: bool = True,
                 constants: Sequence[TensorProto] = ()) -> ort.InferenceSession | CustomOpSession:
    """The one way hbtools builds a session over a standard-ONNX model.

    A model with registered custom CPU ops gets a ``CustomOpSession`` (onnxruntime
    around the custom nodes); any other model a plain onnxruntime session. ``spinning`` and
    ``memory_pattern``: as ``ort_session``'s (sessions that take turns need them off); ``constants``:
    initializers of the model kept apart (``lowered_parts``), as ``ort_session``'s.
    """
    if any(custom.is_foreign_domain(n.domain) for n in model.graph.node):
        missing = custom.unregistered_nodes(model)
        if missing:
            raise HbError(custom.unregistered_message(missing[0]),
                          hint="in Python, call hbtools.ops.custom.load_op_files(['<file>.py']) first")
        if custom.has_custom_nodes(model):
            from hbtools.runtime.custom_session import CustomOpSession

            if constants:
                model = copy.deepcopy(model)
                model.graph.initializer.extend(constants)
            return CustomOpSession(model, threads=threads)
    return ort_session(model, threads=threads, per_node=per_node, spinning=spinning, memory_pattern=memory_pattern,
                       constants=constants)


def fetching_session(model: ModelProto, tensors: Sequence[str], *, spinning: bool = True,
                     memory_pattern: bool = True, threads: int = 0,
                     **lowering: bool) -> ort.InferenceSession | CustomOpSession:
    """A session over ``model`` (Hz ops lowered with the ``lower_model`` options ``lowering``)
    that can also fetch the float ``tensors``."""
    lowered, constants = lowered_parts(model, keep=tensors, **lowering)
    return make_session(_fetching(lowered, tensors), spinning=spinning, memory_pattern=memory_pattern,
                        threads=threads, constants=constants)


def fetching_model(model: ModelProto, tensors: Sequence[str], **lowering: bool) -> ModelProto:
    """``model`` lowered (``lower_model`` options ``lowering``) with the float ``tensors`` as outputs too."""
    return _fetching(lower_model(model, keep=tensors, **lowering), tensors)


def _fetching(lowered: ModelProto, tensors: Sequence[str]) -> ModelProto:
    present = {o.name for o in lowered.graph.output}
    for t in dict.fromkeys(tensors):
        if t not in present:
            lowered.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    return lowered


# onnxruntime rewrites that replace a chain of float element-wise nodes by one kernel which rounds
# differently (GELU, LayerNorm, MatMul+Add, attention, ...). Whether they apply depends on the
# graph around the chain: the lookup table of a function, computed on its own, and the same
# nodes inside a calibrated model would round differently. No session uses them, so every such
# chain computes node by node everywhere. Names onnxruntime does not know are ignored.
ROUNDING_FUSIONS = ("GeluFusion", "GeluFusionL1", "GeluFusionL2", "LayerNormFusion", "LayerNormFusionL1",
                    "LayerNormFusionL2", "SimplifiedLayerNormFusion", "SkipLayerNormFusion", "BiasGeluFusion",
                    "FastGeluFusion", "QuickGeluFusion", "BiasSoftmaxFusion", "MatMulScaleFusion",
                    "MatMulAddFusion", "AttentionFusion", "EmbedLayerNormFusion",
                    # a constant Add / Mul after a Conv folded into its bias / weights: a conv over whole-number
                    # levels then sums scaled weights (a calibrated model's float32 requantization of an
                    # accumulator, ``Conv -> Add(bias levels) -> Mul(multiplier)``, left its quantized model by
                    # up to 0.37 on a face detector with zero points on RDK X3)
                    "ConvAddFusion", "ConvMulFusion")
# onnxruntime (1.20 on) quantizes the constant float weight and bias of a Conv / Gemm / MatMul whose
# input comes from a DequantizeLinear, to make a QDQ unit of it. Every float product hbtools lowers
# is meant as it stands (a CPU node's float weights; a float conv over whole-number levels), so no
# session lets it: it changed a debugger reference's conv output by 0.04.
WEIGHT_REQUANTIZATION = ("WeightBiasQuantization",)
# onnxruntime pushes Transposes through the ops around them (a LayerNorm's ReduceMean then sums along a
# strided axis, in another order) as far as the session's graph lets it. The simulator runs a .bin's float CPU
# regions as sessions of their own, cut at every Hz op, so the same ops summed in other orders there than in
# the whole quantized model: hb_verifier strict failed on PP-OCRv6 small rec for bernoulli2 (all 748400
# outputs off by up to 0.037). No session that runs a model moves them: every op computes on the layout it is
# written with. The optimize stage's rewrite (``rounding_fusions``) does, and the artefacts hold its result.
TRANSPOSE_PUSHING = ("TransposeOptimizer", "TransposeOptimizer_CPUExecutionProvider", "NhwcTransformer")


def ort_session(model: ModelProto, *, threads: int = 0, spinning: bool = True, per_node: bool = False,
                optimized_model_path: str | None = None, rounding_fusions: bool = False,
                memory_pattern: bool = True, shared_arena: bool = False,
                constants: Sequence[TensorProto] = ()) -> ort.InferenceSession:
    """A plain onnxruntime CPU session (no custom ops): the one place hbtools configures onnxruntime.

    ``spinning=False`` stops idle intra-op threads from spinning (for callers that
    alternate short runs with numpy work, or runs of several sessions: each has its own threads,
    and those of the session that just ran would spin against the next one's). ``per_node``:
    only onnxruntime's basic graph rewrites, so every node computes as it stands (no layout
    change, no conv fusion either); the optimize stage rewrites with it.
    Sessions that run a model, the quantized one and the simulator's segments included, take
    the layout rewrites too: the blocked (NCHWc) float convs, which a quantized model's grouped
    convs run on (exact: whole numbers below 2**24), are several times faster than the plain
    ones. No session that runs a model fuses element-wise chains (``ROUNDING_FUSIONS``) or pushes
    Transposes (``TRANSPOSE_PUSHING``); ``rounding_fusions`` allows both where the session only
    rewrites a graph (the optimize stage's MatMul + Add -> Gemm, for one, decides what the partition
    sees). ``optimized_model_path`` makes
    onnxruntime write its rewrite of the model there. ``shared_arena``: the session allocates from
    one memory arena shared by all such sessions of the process (see ``release_shared_arena``).
    ``constants``: initializers the model's graph takes in addition to its own (``serialized``); a list is
    emptied once they are serialized, so that a model the caller let go of (a copy read back to build one
    session) goes before onnxruntime makes its own copies of them.
    """
    options = ort.SessionOptions()
    # Errors come back as exceptions, which the tools turn into one ERROR line; onnxruntime logging
    # them too would put its own lines on the console (a batching probe expects to fail, for one).
    options.log_severity_level = 4
    if per_node:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # Without the arena, memory of the many large intermediate outputs calibration and
    # the similarity report fetch goes back to the system after each run.
    options.enable_cpu_mem_arena = False
    if shared_arena:
        _register_shared_arena()
        options.add_session_config_entry("session.use_env_allocators", "1")
    if threads:
        options.intra_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # ``memory_pattern=False``: a session keeps no block of its intermediates between runs (several
    # sessions that take turns would each hold one: about a whole model's activations each).
    options.enable_mem_pattern = memory_pattern
    if optimized_model_path:
        options.optimized_model_filepath = optimized_model_path
    model, constants, apart = _within_protobuf_limit(model, constants)
    if apart:
        options.add_external_initializers(list(apart), [ort.OrtValue.ortvalue_from_numpy(a) for a in apart.values()])
        if optimized_model_path:  # its rewrite keeps them apart too, as external data beside it
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                             f"{Path(optimized_model_path).name}.data")
    data = serialized(model, constants)
    if isinstance(constants, list):
        constants.clear()
    try:
        session = _Session(data, options, providers=["CPUExecutionProvider"],
                           disabled_optimizers=[*WEIGHT_REQUANTIZATION,
                                                *([] if rounding_fusions else [*ROUNDING_FUSIONS, *TRANSPOSE_PUSHING])])
    except ort.capi.onnxruntime_pybind11_state.NotImplemented as exc:
        raise _no_cpu_kernel(exc) from exc
    session.apart = apart  # onnxruntime reads these arrays where they are, as long as the session lives
    return session


def _within_protobuf_limit(model: ModelProto, constants: Sequence[TensorProto]
                           ) -> tuple[ModelProto, Sequence[TensorProto], dict[str, np.ndarray]]:
    """``model`` and ``constants`` as onnxruntime can parse them, and the weights to hand it apart.

    onnxruntime parses no model over protobuf's limit (``PROTOBUF_LIMIT``): the large initializers then go
    to it as arrays, each left in the model as external data of its type and shape."""
    if model_io.serialized_size(model) + sum(map(model_io.tensor_size, constants)) < model_io.PROTOBUF_LIMIT:
        return model, constants, {}
    apart = {t.name: numpy_helper.to_array(t) for t in [*model.graph.initializer, *constants] if is_large(t)}
    kept = copy_model(model, lambda t: t.name not in apart)
    kept.graph.initializer.extend(_supplied_apart(t) for t in model.graph.initializer if t.name in apart)
    rest = [t if t.name not in apart else _supplied_apart(t) for t in constants]
    return kept, rest, apart


def _supplied_apart(tensor: TensorProto) -> TensorProto:
    """``tensor`` as external data that ``add_external_initializers`` supplies (no file holds it)."""
    return model_io.external_reference(tensor, f"{tensor.name}.apart", 0, 0)


# Sessions that take turns running many times (the debugger's stages and tails: thousands of runs)
# can allocate from one arena in onnxruntime's environment instead of the system. Without an
# arena each run takes its intermediates (a block of tens of MB on a text detector) from the
# system and gives them back: the pages are faulted in and zeroed again on every run, 20% of the
# process time of PP-OCR det's weight sensitivity went to the kernel. An arena per session holds
# every session's peak at once (3.4 GB there); the shared one holds what the runs in flight need.
# Its blocks go back to the system with ``release_shared_arena``. Memory is only reused, so the
# arithmetic (and every value) is the same.
_shared_arena_lock = threading.Lock()
_shared_arena: list[ort.InferenceSession] = []  # once registered: a tiny session whose run can shrink the arena


def _register_shared_arena() -> None:
    with _shared_arena_lock:
        if _shared_arena:
            return
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        try:  # max_mem 0 (no limit), extended by what is asked (not the next power of two), default chunks
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 1, -1, -1))
        except RUN_ERRORS:  # the caller registered a CPU allocator of its own: the sessions share that one
            pass
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "shrink",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        options = ort.SessionOptions()
        options.log_severity_level = 4
        options.intra_op_num_threads = 1
        options.add_session_config_entry("session.use_env_allocators", "1")
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        _shared_arena.append(ort.InferenceSession(model.SerializeToString(), options,
                                                  providers=["CPUExecutionProvider"]))


def release_shared_arena() -> None:
    """Give the free blocks of the shared arena (``ort_session(shared_arena=True)``) back to the system."""
    with _shared_arena_lock:
        if not _shared_arena:
            return
        run_options = ort.RunOptions()
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        _shared_arena[0].run(None, {"x": np.zeros(1, np.float32)}, run_options)


def _no_cpu_kernel(exc: Exception) -> HbError:
    """onnxruntime has no CPU kernel for a node (its GPU-only contrib ops: BiasAdd, GroupNorm, ...)."""
    found = re.search(r"implementation for (\w+)\((\d+)\) node with name '([^']*)'", str(exc))
    if found is None:
        return HbError(f"onnxruntime cannot run the model on the CPU: {str(exc).strip().splitlines()[0]}")
    op, version, node = found.groups()
    return HbError(f"node '{node}' is {op} (version {version}), which onnxruntime has no CPU kernel for, and hbtools "
                   "does not write it as standard ops", hint="export the model without it (onnxruntime's "
                   "transformer optimizer adds GPU-only fusions when told the model runs on a GPU: optimize for CPU)")


class _Session(ort.InferenceSession):
    """onnxruntime's session whose check of the fed names is linear: onnxruntime looks each input up
    in a list of the fed names, quadratic in a lowered model fed thousands of calibration grids
    (0.1 s a run at 10,000 inputs, more than the run itself)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - onnxruntime's signature
        super().__init__(*args, **kwargs)
        # onnxruntime keeps the serialized model for the lifetime of the session, only to rebuild it
        # on another execution provider after a failure; a CPU-only session is never rebuilt, and the
        # bytes (a copy of every weight) multiplied by the sessions a search holds (a ViT: gigabytes).
        self.disable_fallback()
        self._model_bytes = None

    def _validate_input(self, feed_input_names) -> None:  # noqa: ANN001 - onnxruntime's signature
        super()._validate_input(set(feed_input_names))


class FeedError(HbError, ValueError):
    """Inputs or output names that do not fit the model (a ValueError for API users)."""


class HB_ONNXRuntime:  # noqa: N801 - name fixed by the toolkit's public API
    """onnxruntime session over a float, optimized, calibrated or quantized model."""

    def __init__(self, model_file: str | Path | ModelProto | bytes | None = None,
                 onnx_model: ModelProto | bytes | None = None, *, threads: int = 0) -> None:
        """``threads``: onnxruntime intra-op threads (0: onnxruntime's default).

        Like onnxruntime's own session, the model may also be given as a ``ModelProto`` or its
        serialized bytes, positionally or as ``onnx_model``."""
        if onnx_model is None and isinstance(model_file, ModelProto | bytes):
            model_file, onnx_model = None, model_file
        if isinstance(onnx_model, bytes):
            try:
                onnx_model = onnx.load_from_string(onnx_model)
            except Exception as exc:  # protobuf's DecodeError and kin: not an ONNX model's bytes
                raise HbError(f"the {len(onnx_model)} bytes given are not a readable ONNX model ({exc})",
                              hint="give the bytes of an .onnx file, a ModelProto, or the file's path") from None
        if onnx_model is None:
            if model_file is None:
                raise HbError("HB_ONNXRuntime needs model_file or onnx_model")
            if not isinstance(model_file, str | Path):
                raise HbError(f"model_file must be a file path, a ModelProto or bytes, not {type(model_file).__name__}")
            onnx_model = load_model(model_file)
        elif not isinstance(onnx_model, ModelProto):
            raise HbError(f"onnx_model must be a ModelProto or its bytes, not {type(onnx_model).__name__}")
        self.model = onnx_model
        self._threads = threads
        self._build()
        # The shapes the model was built for, before any set_dim_param.
        self._fixed_shapes = {i.name: list(i.shape) for i in self._inputs if all(isinstance(d, int) for d in i.shape)}

    def _build(self) -> None:
        lowered, constants = lowered_parts(self.model)
        self._session = make_session(lowered, threads=self._threads, constants=constants)
        original_inputs = {i.name for i in self.model.graph.input} - {t.name for t in self.model.graph.initializer}
        self._inputs = [i for i in self._session.get_inputs() if i.name in original_inputs]
        self._outputs = self._session.get_outputs()
        # the intermediate tensors asked for so far, and the one session that fetches them all
        self._fetching: tuple[frozenset[str], ort.InferenceSession | CustomOpSession] | None = None
        # per set of tensors fetched, how a batch runs (``_batch_run``): whole, or each output's sample axis
        self._batch_axes: dict[tuple[str, ...], object] = {}
        self._lock = threading.Lock()

    # onnxruntime's session cannot be pickled; a copy (copy.deepcopy, multiprocessing) rebuilds
    # one from the model, so evaluation scripts can hand a session to worker processes.
    def __getstate__(self) -> dict:
        return {"model": self.model.SerializeToString(), "threads": self._threads, "fixed": self._fixed_shapes}

    def __setstate__(self, state: dict) -> None:
        self.model = onnx.load_from_string(state["model"])
        self._threads = state["threads"]
        self._build()
        self._fixed_shapes = state["fixed"]

    @property
    def layout(self) -> list[str | None]:
        """Each input's layout, ``'NCHW'`` or ``'NHWC'`` (None for an input that is not 4-D), as the
        vendor's sample scripts read it (``sess.layout[0]``) to lay out the image they feed."""
        return [input_layout(self.model, i.name) for i in self._inputs]

    def set_dim_param(self, input_index: int, dim_index: int, param: str) -> None:
        """Make dimension ``dim_index`` of input ``input_index`` symbolic (``param``, e.g. ``'?'``):
        the vendor's sample scripts call ``sess.set_dim_param(0, 0, '?')`` to feed batches."""
        if not 0 <= input_index < len(self._inputs):
            raise FeedError(f"set_dim_param: input index {input_index} out of range; the model has "
                            f"{len(self._inputs)} input(s) {self.input_names}")
        name = self._inputs[input_index].name
        graph_input = next(i for i in self.model.graph.input if i.name == name)
        dims = graph_input.type.tensor_type.shape.dim
        if not 0 <= dim_index < len(dims):
            raise FeedError(f"set_dim_param: input '{name}' has {len(dims)} dimension(s); dim index {dim_index} "
                            "is out of range")
        model = copy.deepcopy(self.model)
        dim = next(i for i in model.graph.input if i.name == name).type.tensor_type.shape.dim[dim_index]
        dim.dim_param = str(param)
        self.model = model
        self._build()

    def get_inputs(self) -> list:
        return list(self._inputs)

    def get_hw(self, index: int = 0, layout: str | None = None) -> tuple[int, int]:
        """Height and width of input ``index``, read in ``layout`` (default: the input's own,
        see ``layout``): the vendor's sample scripts resize their image to this size."""
        shape = self._input_at(index, "get_hw").shape
        layout = layout or self.layout[index]
        if layout not in ("NCHW", "NHWC") or len(shape) != 4:
            raise FeedError(f"get_hw: input '{self._inputs[index].name}' of shape {shape} is not an NCHW or "
                            "NHWC image; pass layout='NCHW' or 'NHWC'")
        return shape[layout.index("H")], shape[layout.index("W")]

    def get_input_type(self, index: int = 0) -> int:
        """The ONNX element type (``onnx.TensorProto`` enum) of input ``index``: scripts test
        ``== 3`` (int8) to tell a quantized model, whose image inputs are int8, from a float one."""
        name = self._input_at(index, "get_input_type").name
        return next(i for i in self.model.graph.input if i.name == name).type.tensor_type.elem_type

    def _input_at(self, index: int, what: str):  # noqa: ANN202 - onnxruntime's NodeArg
        if not 0 <= index < len(self._inputs):
            raise FeedError(f"{what}: input index {index} out of range; the model has "
                            f"{len(self._inputs)} input(s) {self.input_names}")
        return self._inputs[index]

    def set_providers(self, providers: Sequence[str]) -> None:
        """Accepted for scripts that ask for a GPU: everything runs on onnxruntime's CPU provider
        here (the custom ops are lowered for it), so another provider is only warned about."""
        others = [p for p in ([providers] if isinstance(providers, str) else providers)
                  if p != "CPUExecutionProvider"]
        if others:
            logger.warning("HB_ONNXRuntime runs on CPUExecutionProvider only; ignoring %s", others)

    def get_provider(self) -> str:
        return "CPUExecutionProvider"

    def get_outputs(self) -> list:
        return list(self._outputs)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self._inputs]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self._outputs]

    @property
    def input_shapes(self) -> list[list[int | str]]:
        """Each input's shape; a symbolic dimension is its name (``'?'`` after ``set_dim_param``).
        Scripts read ``sess.input_shapes[0][0]`` for the batch and reshape raw samples with them."""
        return [list(i.shape) for i in self._inputs]

    @property
    def output_shapes(self) -> list[list[int | str]]:
        return [list(o.shape) for o in self._outputs]

    @property
    def input_num(self) -> int:
        return len(self._inputs)

    @property
    def output_num(self) -> int:
        return len(self._outputs)

    @property
    def input_types(self) -> list[int]:
        """Each input's ONNX element type (``onnx.TensorProto`` enum), by position as the vendor's
        list: scripts test ``sess.input_types[0] == TensorProto.FLOAT`` or map it to a numpy type."""
        return [self.get_input_type(i) for i in range(len(self._inputs))]

    @property
    def output_types(self) -> list[int]:
        """Each output's ONNX element type (``onnx.TensorProto`` enum), by position."""
        declared = {o.name: o.type.tensor_type.elem_type for o in self.model.graph.output}
        return [declared.get(o.name) or helper.np_dtype_to_tensor_dtype(np.dtype(_NUMPY_OF_ORT.get(o.type, np.float32)))
                for o in self._outputs]

    def run(self, output_names: Sequence[str] | None, feed_dict: dict, input_offset: int = 128,
            **_: object) -> list[np.ndarray]:
        """Run with image data: uint8 feeds for int8 inputs are shifted by ``input_offset``."""
        return self._run(output_names, feed_dict, input_offset)

    def run_feature(self, output_names: Sequence[str] | None, feed_dict: dict, input_offset: int = 0,
                    **_: object) -> list[np.ndarray]:
        """Run with feature-map data (offset 0 by default)."""
        return self._run(output_names, feed_dict, input_offset)

    def _run(self, output_names: Sequence[str] | None, feed_dict: dict, input_offset: object) -> list[np.ndarray]:
        input_offset = _offset(input_offset)
        if not isinstance(feed_dict, Mapping):
            # The vendor's API documents the feed as a dict only; arrays by position could silently go to the
            # wrong inputs of a model whose input order differs from the user's.
            raise FeedError(f"the inputs are given as {type(feed_dict).__name__}; give a dict {{input name: array}} "
                            f"(the model's inputs, in order: {self.input_names})")
        unknown = set(feed_dict) - set(self.input_names)
        if unknown:
            raise FeedError(f"unknown input name(s) {sorted(unknown)}; the model's inputs are {self.input_names}")
        missing = set(self.input_names) - set(feed_dict)
        if missing:
            raise FeedError(f"missing input(s) {sorted(missing)}")
        feeds = {}
        for arg in self._inputs:
            target = _NUMPY_OF_ORT.get(arg.type)  # None: a type numpy has no name for here, passed on as given
            try:
                data = np.asarray(feed_dict[arg.name])
            except (ValueError, TypeError) as exc:  # ragged nested lists
                raise FeedError(f"input '{arg.name}' is not an array ({exc}); give a numpy array of shape "
                                f"{arg.shape}") from None
            data = convert_feed(data, target, input_offset, arg.name) if target is not None else data
            _check_shape(arg.name, data.shape, arg.shape)
            if warning := nan_warning(arg.name, data):
                logger.warning(warning)
            feeds[arg.name] = data
        # A single name is one output, not a sequence of one-letter names.
        names = [output_names] if isinstance(output_names, str) else list(output_names or self.output_names)
        if not all(isinstance(n, str) for n in names):
            raise FeedError(f"output_names takes tensor names (a name, a list of names, or None for all the outputs), "
                            f"got {output_names!r}; the model's outputs are {self.output_names}")
        fetchable = self._fetchable
        wrong = [n for n in names if n not in fetchable]
        if wrong:
            # The closest names come from every tensor, not only the outputs: a layer compared between
            # the float and the quantized model is named '<tensor>_quantized' (integer) in the latter.
            quantized = f"{wrong[0]}_quantized"  # short names are too unlike it for the closest-name match
            near = f" (closest: '{quantized}')" if quantized in fetchable else \
                closest_names(wrong[0], sorted(fetchable))
            raise FeedError(f"the model has no output or intermediate tensor '{wrong[0]}'{near}; its outputs are "
                            f"{self.output_names}")
        try:
            return self._batch_run(names, feeds)
        except RUN_ERRORS as exc:
            message = f"onnxruntime cannot run the model on these inputs: {str(exc).splitlines()[0]}"
            resized = [n for n, d in feeds.items() if list(d.shape) != self._fixed_shapes.get(n, list(d.shape))]
            if resized:
                # After set_dim_param the graph may still hold sizes of the shape it was built for
                # (a Reshape's target shape), which onnxruntime reports without naming the cause.
                shapes = ", ".join(f"'{n}' {'x'.join(map(str, self._fixed_shapes[n]))}" for n in resized)
                message += (f"; the model's own shapes (Reshape targets, ...) were built for input shape {shapes}: "
                            "feed that shape (a batch of them takes any size along the first axis)")
            raise FeedError(message) from None

    def _batch_run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The run of ``feeds``; a batch fed to a model built for one sample (after ``set_dim_param``) gives
        each sample's own outputs.

        Such a model may hold the batch of one in its own shapes (a ``Resize`` to fixed sizes, a ``Reshape``
        the optimize stage could not write without it): the whole batch then fails or, worse, mixes or drops
        samples. The first batch asking for ``names`` decides, on distinct samples (the batch's own, or its
        first sample and that sample rolled along its last axis where they are all the same, as a warm-up
        batch of zeros is): where each output of a whole run holds the samples' own outputs along some axis
        (the first for most, the second for a sequence-first [T, N, C]; an output the samples share, once;
        any where the samples' outputs differ in size, as an NMS keeps its own count of boxes), batches run
        whole from then on; else sample by sample, each output's samples joined along that axis."""
        session = self._session_for(names)
        count = self._stacked_samples(feeds)
        key = tuple(names)
        if not count or self._batch_axes.get(key) is WHOLE:
            return session.run(names, feeds)
        samples = [{n: d[i:i + 1] for n, d in feeds.items()} for i in range(count)]
        if key not in self._batch_axes:
            own = _distinct(samples)
            probe = samples if own else _rolled_pair(samples[0])
            if probe is None:  # no sample can differ from another (constant inputs): nothing to keep apart
                return session.run(names, feeds)
            self._batch_axes[key], answer = _decided(session, names, probe)
            if own:
                return answer
            if self._batch_axes[key] is WHOLE:
                return session.run(names, feeds)
        return _stacked([session.run(names, s) for s in samples], self._batch_axes[key], names)

    def _stacked_samples(self, feeds: dict[str, np.ndarray]) -> int | None:
        """How many samples ``feeds`` stack along the first axis of inputs built for one (None: not such a batch)."""
        counts = {d.shape[0] if d.ndim and self._fixed_shapes.get(n, [None])[:1] == [1] else None
                  for n, d in feeds.items()}
        count = counts.pop() if len(counts) == 1 else None
        return count if count is not None and count > 1 else None

    def _session_for(self, names: list[str]) -> ort.InferenceSession | CustomOpSession:
        """The session that can fetch ``names``: the model's own, or (intermediate tensors asked
        for, as when comparing layers of the float and quantized models) one over the model with every
        intermediate tensor asked for so far as outputs too. One such session at a time: a session per set
        of names held a copy of the weights each (a layer-by-layer comparison, one tensor per call, grew
        by 35 MB a layer on a 22 MB model: hunt 41 D3); a name it lacks rebuilds it with the rest."""
        extra = {n for n in names} - set(self.output_names)
        if not extra:
            return self._session
        with self._lock:
            if self._fetching is None or not extra <= self._fetching[0]:
                wanted = frozenset(extra | (self._fetching[0] if self._fetching else set()))
                self._fetching = None  # its weights go before the next session's are made
                self._fetching = (wanted, make_session(lower_model(with_outputs(self.model, sorted(wanted))),
                                                       threads=self._threads))
            return self._fetching[1]

    @property
    def _fetchable(self) -> set[str]:
        return {o.name for o in self._outputs} | {v.name for v in self.model.graph.value_info} | {
            t for n in self.model.graph.node for t in n.output}


def with_outputs(model: ModelProto, names: Sequence[str]) -> ModelProto:
    """A copy of ``model`` with the tensors ``names`` as graph outputs too, each with its own
    element type; a name no node produces is left out."""
    from hbtools.runtime.structure import tensor_info

    out = ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output}
    produced = {o for n in out.graph.node for o in n.output}
    wanted = [n for n in dict.fromkeys(names) if n not in present and n in produced]
    info = tensor_info(out) if wanted else {}
    for name in wanted:
        elem_type = info[name].elem_type if name in info else TensorProto.FLOAT
        out.graph.output.append(helper.make_tensor_value_info(name, elem_type, None))
    return out


class HBRuntime(HB_ONNXRuntime):
    """The newer toolkits' one runtime class (``from horizon_tc_ui import HBRuntime``), for the ONNX
    artefacts: ``HBRuntime("m_quantized_model.onnx")``, then ``input_names``, ``output_names``,
    ``input_shapes`` and ``run(names, feed)`` as on HB_ONNXRuntime. A compiled model (``.bin``, and
    the newer ``.hbm`` / ``.bc``) runs with hrt_model_exec instead."""

    def __init__(self, model_file: str | Path | ModelProto | bytes | None = None, **kwargs: object) -> None:
        if isinstance(model_file, str | Path) and Path(model_file).suffix.lower() in (".bin", ".hbm", ".bc"):
            raise HbError(f"HBRuntime runs ONNX models here; {model_file} is a compiled model",
                          hint="run it with hrt_model_exec infer, or give HBRuntime the quantized ONNX model")
        super().__init__(model_file, **kwargs)  # type: ignore[arg-type]

    @property
    def sess(self) -> ort.InferenceSession | CustomOpSession:
        """The onnxruntime session underneath, as scripts of the newer toolkits reach it."""
        return self._session


def input_layout(model: ModelProto, name: str) -> str | None:
    """The layout of graph input ``name``: what the node reading it says (an HzPreprocess's
    ``layout``; the Transpose to NCHW the quantized model starts with for an NHWC input), else
    where a 4-D shape has its 1 or 3 channels, else ONNX's NCHW."""
    dims = next(i for i in model.graph.input if i.name == name).type.tensor_type.shape.dim
    if len(dims) != 4:
        return None
    for node in model.graph.node:
        if name not in node.input:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "HzPreprocess" and "layout" in attrs:
            return attrs["layout"].decode() if isinstance(attrs["layout"], bytes) else str(attrs["layout"])
        if node.op_type == "Transpose" and list(attrs.get("perm", [])) == [0, 3, 1, 2]:
            return "NHWC"
        if node.op_type == "Transpose" and list(attrs.get("perm", [])) == [0, 2, 3, 1]:
            return "NCHW"
    sizes = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    if sizes[3] in (1, 3) and sizes[1] not in (1, 3):
        return "NHWC"
    return "NCHW"


def _check_shape(name: str, got: tuple[int, ...], want: Sequence[object]) -> None:
    fixed = len(got) == len(want) and all(not isinstance(w, int) or w == g for g, w in zip(got, want, strict=True))
    if not fixed:
        shown = "x".join(str(w) if isinstance(w, int) else "?" for w in want)
        raise FeedError(f"input '{name}' has shape {'x'.join(map(str, got)) or 'scalar'}, the model expects {shown}")


def _offset(value: object) -> int:
    """``input_offset`` as an int: the vendor's sample scripts pass their click option, a string ('128')."""
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = float("nan")
    if not number.is_integer():
        raise FeedError(f"input_offset {value!r} is not a whole number; use 128 for 0..255 image data fed to "
                        "int8 inputs, 0 for data already in the input's range")
    return int(number)


WHOLE = "whole"  # ``_batch_axes``: the whole batch gives each sample's outputs


def _batch_axis(single: tuple[int, ...], whole: tuple[int, ...], count: int) -> int | str | None:
    """The axis of an output along which a whole run of ``count`` samples holds the samples' outputs of shape
    ``single``: where ``single`` has 1 and ``whole`` has ``count``, all else equal; "shared" where the whole run has
    the one sample's shape (an output no sample changes, as an SSD's priors); None where neither fits."""
    if tuple(whole) == tuple(single):
        return "shared"
    for axis, size in enumerate(single):
        if size == 1 and tuple(whole) == (*single[:axis], count, *single[axis + 1:]):
            return axis
    return None


def _decided(session: object, names: list[str], samples: list[dict]) -> tuple[object, list[np.ndarray]]:
    """How batches of ``samples``' kind run (``WHOLE``, or each output's sample axis) and the outputs of ``samples``."""
    try:
        whole = session.run(names, {n: np.concatenate([s[n] for s in samples]) for n in samples[0]})
    except RUN_ERRORS:
        whole = None
    singles = [session.run(names, s) for s in samples]
    found = [_agreeing_axis(w, [o[k] for o in singles]) for k, w in enumerate(whole)] if whole is not None else []
    if whole is not None and None not in found:
        return WHOLE, whole
    axes = [a if isinstance(a, int) or a == "shared" else _first_unit_axis(singles[0][k].shape)
            for k, a in enumerate(found or [None] * len(names))]
    return axes, _stacked(singles, axes, names)


def _distinct(samples: list[dict]) -> bool:
    return any(not np.array_equal(s[n], samples[0][n]) for s in samples[1:] for n in s)


def _rolled_pair(sample: dict) -> list[dict] | None:
    """``sample`` and a copy of it rolled by one along its inputs' last axes (values the model takes, in other
    places), or None where that changes nothing."""
    rolled = {n: np.roll(d, 1, axis=-1) if d.ndim else d for n, d in sample.items()}
    return [sample, rolled] if _distinct([sample, rolled]) else None


def _agreeing_axis(whole: np.ndarray, singles: list[np.ndarray]) -> int | str | None:
    """``_batch_axis`` of an output where the whole run's values are the samples' own along it ("ragged" where
    the samples' outputs differ in size, or are scalars: only a whole run gives them), else None."""
    if any(o.shape != singles[0].shape for o in singles) or not singles[0].ndim:  # a count, boxes an NMS kept
        return "ragged"
    axis = _batch_axis(singles[0].shape, whole.shape, len(singles))
    if axis == "shared":
        return axis if all(same_outputs(whole, o) for o in singles) else None
    if axis is None or not same_outputs(whole, np.concatenate(singles, axis=axis)):
        return None
    return axis


def _first_unit_axis(shape: tuple[int, ...]) -> int | None:
    return next((axis for axis, size in enumerate(shape) if size == 1), None)


def _stacked(runs: list[list[np.ndarray]], axes: list, names: list[str]) -> list[np.ndarray]:
    """Each output's samples (``runs``: one list of outputs per sample) joined along its axis in ``axes``
    ("shared": the first sample's)."""
    out = []
    for k, parts in enumerate(zip(*runs, strict=True)):
        axis = axes[k]
        if axis == "shared" and all(np.array_equal(p, parts[0]) for p in parts):
            out.append(parts[0])
        elif isinstance(axis, int) and all(p.shape == parts[0].shape for p in parts):
            out.append(np.concatenate(parts, axis=axis))
        else:
            raise FeedError(f"output '{names[k]}' has no batch axis this model keeps its samples apart on (shapes "
                            f"{', '.join(str(list(p.shape)) for p in parts)} for one sample each): feed one sample "
                            "at a time")
    return out


def convert_feed(data: np.ndarray, target: type, offset: int, name: str) -> np.ndarray:
    """Lossless conversions between the feed's dtype and the input's dtype (seed 001 §6.2.11)."""
    if not data.dtype.isnative:  # big-endian data (read with '>f4'): the same values in the machine's order
        data = data.astype(data.dtype.newbyteorder("="))
    if data.dtype == target:
        return data
    if target == np.object_ and data.dtype.kind in "UO":  # strings
        return data.astype(np.object_)
    if target == np.int8 and data.dtype == np.uint8 and offset == 128:
        # 0..255 pictures to an int8 input: x - 128 is x with its top bit flipped (a fifth of the time of the
        # general path's int64 copy, which small models paid on every run: hunt 41 D9)
        return (data ^ np.uint8(0x80)).view(np.int8)
    if target in (np.int8, np.uint8) and np.issubdtype(data.dtype, np.integer):
        # Image values go to an int8 input shifted down by the offset, whatever integer type holds
        # them (uint8 pictures; int64 from a Python list); int8 data to a uint8 input shifted up.
        shift = -offset if target == np.int8 else (offset if data.dtype == np.int8 else 0)
        shifted = data.astype(np.int64) + shift
        info = np.iinfo(target)
        if shifted.size and (shifted.min() < info.min or shifted.max() > info.max):
            raise FeedError(f"input_offset {offset} moves {data.dtype} data of input '{name}' out of the "
                            f"{np.dtype(target).name} range {info.min}..{info.max}; use input_offset 128 for "
                            f"0..255 image data (0 for data already in {np.dtype(target).name})")
        return shifted.astype(target)
    if target == np.float32 and data.dtype in (np.uint8, np.int8, np.float64, np.float16):
        if overflow := float32_overflow(data):
            raise FeedError(f"input '{name}' takes float32, and {overflow} of the float64 values given are beyond "
                            f"float32's range (±{np.finfo(np.float32).max:.4g}): check the data's scale")
        return data.astype(np.float32)
    if integers_fit(data, target):  # indices and sizes in another integer type
        return data.astype(target)
    if np.issubdtype(target, np.floating) and (data.dtype == np.bool_ or np.issubdtype(data.dtype, np.integer)):
        # a 0/1 mask or a count as bool / int64 for a float input: taken where the float type holds every value
        inexact = first_inexact_in_float(data, target)
        if inexact is None:
            return data.astype(target)
        kind = np.dtype(target).name
        raise FeedError(f"input '{name}' takes {kind}, which does not hold the {data.dtype} value {inexact} "
                        f"exactly (it holds every whole number up to ±2**{np.finfo(target).nmant + 1}, larger ones "
                        f"only in steps): give the data as {kind} (.astype(np.{kind})) if rounding is meant")
    if np.issubdtype(target, np.integer) and np.issubdtype(data.dtype, np.integer):
        info = np.iinfo(target)
        raise FeedError(f"input '{name}' takes {np.dtype(target).name}, and {data.dtype} data holds values outside "
                        f"its range {info.min}..{info.max}")
    raise FeedError(f"input '{name}' takes {np.dtype(target).name}; {data.dtype} data cannot be converted to it "
                    f"exactly: give it as {np.dtype(target).name} (.astype(np.{np.dtype(target).name}))")


