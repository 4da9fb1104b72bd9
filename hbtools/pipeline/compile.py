"""Compile stage: the quantized model, its partition and descriptors into the ``.bin`` container."""

from __future__ import annotations

import logging
from pathlib import Path

from onnx import ModelProto, TensorProto

from hbtools.config.model import Config, InputSpec
from hbtools.errors import HbError
from hbtools.graph import model_io
from hbtools.graph.edge_nodes import check_names, remove_edge_nodes
from hbtools.graph.graph import GraphView, dtype_name, elements
from hbtools.march.layout import quantized_layout, to_layout
from hbtools.march.profiles import MarchProfile
from hbtools.pipeline.quantize import QuantizedResult
from hbtools.quant.units import Partition
from hbtools.runtime.binfile import BinModel, current_deps, write_bin
from hbtools.runtime.runtime_model import RuntimeModel, load
from hbtools.tools import perf_advice, perf_model, perf_report

log = logging.getLogger("hbtools")


def default_input_source(spec: InputSpec) -> str:
    # Camera pipelines deliver nv12 through the pyramid; everything else comes from memory.
    return "pyramid" if spec.type_rt == "nv12" else "ddr"


def input_descriptors(config: Config, inputs: list[InputSpec], profile: MarchProfile,
                      elem_types: dict[str, int] | None = None) -> list[dict]:
    """``elem_types``: the quantized model's input types (a featuremap may be int64: Gather indices)."""
    out = []
    for spec in inputs:
        layout = quantized_layout(spec, profile)
        out.append({
            "name": spec.name,
            "input_type_rt": spec.type_rt,
            "input_type_train": spec.type_train,
            "input_space_and_range": spec.space_and_range,
            "layout": layout,
            "input_layout_train": spec.layout_train,
            "shape": to_layout(spec.shape, spec.layout_train, layout),
            "dtype": dtype_name((elem_types or {}).get(spec.name, TensorProto.FLOAT))
            if spec.type_rt == "featuremap" else "uint8",
            "input_source": config.compiler.input_source.get(spec.name, default_input_source(spec)),
            "batch": config.input_batch,
            "norm_type": spec.norm_type,
            "mean_value": spec.mean,
            "scale_value": spec.scale,
        })
    return out


def output_descriptors(result: QuantizedResult) -> list[dict]:
    out = []
    for vi in result.model.graph.output:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        elem = vi.type.tensor_type.elem_type
        desc = {"name": vi.name, "shape": dims, "dtype": dtype_name(elem)}
        if vi.name in result.tensors and desc["dtype"] != "float32":
            qt = result.tensors[vi.name]
            desc["scale"] = [float(s) for s in qt.scale.reshape(-1)]
            desc["quantize_axis"] = int(qt.axis) % max(len(dims), 1) if qt.scale.size > 1 else 0
            if qt.zero_point:
                desc["zero_point"] = qt.zero_point
        out.append(desc)
    return out


def partition_record(result: QuantizedResult) -> dict:
    subgraphs: dict[int, list[str]] = {}
    cpu = []
    for unit in result.partition.units:
        if unit.on == "BPU":
            subgraphs.setdefault(unit.subgraph, []).extend(n.name for n in unit.nodes)
        else:
            cpu.append({"name": unit.name, "type": unit.main.op_type, "reason": unit.reason})
    # the type names of makertbin's node table, so hb_perf names each node as the table does
    types = {name: kind for name, _, _, kind in result.partition.rows()}
    return {"subgraphs": [{"id": k, "nodes": v} for k, v in sorted(subgraphs.items())], "cpu_nodes": cpu,
            "node_types": types}


def check_before_calibration(model: ModelProto, partition: Partition, config: Config) -> None:
    """What compile would refuse that the optimized ``model`` already shows: a quantized model too large for a .bin
    (``check_fits_a_bin``), a ``remove_node_name`` no compiled model can have (``check_names``)."""
    check_fits_a_bin(model, partition)
    check_names(model, config.model.remove_node_name)


def check_fits_a_bin(model: ModelProto, partition: Partition) -> None:
    """Refuses, before calibration, a model whose quantized form a .bin cannot hold (``too_large_for_a_bin``).

    Its weights count at the least they can take there: a byte an element for those only BPU nodes read
    (int8), the others at their own size; an optimization that folds a large table away has already run."""
    on_bpu = {n.name for unit in partition.units if unit.on == "BPU" for n in unit.nodes}
    readers = GraphView(model).consumers
    int8 = [t for t in model.graph.initializer
            if t.name in readers and all(n.name in on_bpu for n in readers[t.name])]
    least = model_io.serialized_size(model) - sum(model_io.tensor_size(t) - elements(t.dims) for t in int8)
    if least >= model_io.PROTOBUF_LIMIT:
        raise too_large_for_a_bin(f"at least {least:,}")


def too_large_for_a_bin(size: str) -> HbError:
    """The ERROR for a quantized model of ``size`` bytes over the protobuf limit: the .bin holds it as one message."""
    return HbError(f"the quantized model would be {size} bytes with its weights, over protobuf's limit of "
                   f"{model_io.PROTOBUF_LIMIT:,} bytes for one message, and a .bin holds the model as one message",
                   hint="hb_mapper checker and HB_ONNXRuntime take the model as it is; to compile it, keep its "
                        "largest tables out of it (an embedding lookup can run on the host before the model) or "
                        "split it into models under 2 GiB")


def run(result: QuantizedResult, config: Config, inputs: list[InputSpec], profile: MarchProfile,
        path: Path, *, calibration: str = "") -> Path:
    if model_io.over_protobuf_limit(result.model):  # where its CPU weights were more than check_fits_a_bin could know
        raise too_large_for_a_bin(f"{model_io.serialized_size(result.model):,}")
    # The .bin numbers its inputs as the model (and every ONNX artefact) does, whatever order input_name lists
    # them in: hrt_model_exec --input_file and hb_verifier -i take files by that number.
    order = {vi.name: k for k, vi in enumerate(result.model.graph.input)}
    inputs = sorted(inputs, key=lambda spec: order.get(spec.name, len(order)))
    model = BinModel(
        name=config.model.output_model_file_prefix,
        deps=current_deps(),
        config=config.snapshot,
        inputs=input_descriptors(config, inputs, profile,
                                 {vi.name: vi.type.tensor_type.elem_type for vi in result.model.graph.input}),
        outputs=output_descriptors(result),
        graph=result.model.SerializeToString(),
        partition=partition_record(result),
        deleted_nodes=[],
        perf=None,
        # layer_out_dump: the .bin keeps its conv layers' results reachable (hrt_model_exec infer dumps them)
        meta={"march": profile.name, "board": profile.board, "layer_out_dump": config.model.layer_out_dump,
              **({"calibration_summary": calibration} if calibration else {})},
    )
    model = remove_edge_nodes(model, config.model.remove_node_type, config.model.remove_node_name,
                              until_stable=config.model.fast_perf)
    rm = load(model, str(path))
    if calibration:  # what mixed precision costs, next to what calibration chose (hb_model_info shows it)
        fast, chosen = (perf_model.estimate(rm, profile, as_int8=as_int8).latency_ms for as_int8 in (True, False))
        latencies = f"modelled BPU latency {fast:.4g} ms all-int8, {chosen:.4g} ms as chosen"
        options = config.calibration.options
        # set_all_nodes_int16 leaves the search nothing to choose: every tensor is int16 as asked
        searched = profile.int16 and not options.all_int8 and not options.all_int16 and \
            config.calibration.calibration_type in ("default", "mix")
        hint = " (optimization set_all_nodes_int8 keeps every activation int8 that node_info and the " \
            "options leave to the search)" if searched and chosen > fast * 1.05 else ""
        log.info("calibration summary: %s%s", latencies, hint)
        model.meta["calibration_summary"] = f"{calibration}; {latencies}"
    if config.compiler.debug:  # the static analysis travels in the .bin (hb_perf shows its layer details)
        cost = perf_model.estimate(rm, profile)
        model.perf = {"latency_ms": cost.latency_ms, "ddr_mb_per_frame": cost.ddr_mb,
                      "subgraphs": [sub.summary() for sub in cost.subgraphs]}
    write_bin(path, [model])
    _compile_notes(config, rm, profile)
    page = perf_report.write_report(rm, path.parent, static=True)  # the staging folder: moved with the set
    log.info("static performance page written: %s", config.model.working_dir / page.relative_to(path.parent))
    return path


def _compile_notes(config: Config, rm: RuntimeModel, profile: MarchProfile) -> None:
    """What compile_mode and advice mean for this build, in the log."""
    cc = config.compiler
    if cc.compile_mode != "latency":
        extra = f" (balance_factor {cc.balance_factor})" if cc.compile_mode == "balance" else ""
        log.warning("compile_mode %s%s: hbtools builds one schedule for every compile_mode, so the .bin and "
                    "hb_perf's estimate are those of compile_mode latency", cc.compile_mode, extra)
    if cc.advice:
        lines = perf_advice.advice_lines(rm, profile, cc.advice)
        log.info("advice %d us: %d BPU layer(s) modelled more than %d us above their ideal time%s", cc.advice,
                 len(lines), cc.advice, "" if lines else " (none)")
        for line in lines:
            log.info("%s", line)
