"""Compile stage: the quantized model, its partition and descriptors into the ``.bin`` container."""

from __future__ import annotations

import logging
from pathlib import Path

from hbtools.config.model import Config, InputSpec
from hbtools.march.layout import quantized_layout, to_layout
from hbtools.march.profiles import MarchProfile
from hbtools.pipeline.edge_nodes import remove_edge_nodes
from hbtools.pipeline.quantize import QuantizedResult
from hbtools.runtime.binfile import BinModel, current_deps, write_bin

log = logging.getLogger("hbtools")


def default_input_source(spec: InputSpec) -> str:
    # Camera pipelines deliver nv12 through the pyramid; everything else comes from memory.
    return "pyramid" if spec.type_rt == "nv12" else "ddr"


def input_descriptors(config: Config, inputs: list[InputSpec], profile: MarchProfile) -> list[dict]:
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
            "dtype": "float32" if spec.type_rt == "featuremap" else "uint8",
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
        desc = {"name": vi.name, "shape": dims, "dtype": {1: "float32", 3: "int8", 5: "int16"}.get(elem, str(elem))}
        if vi.name in result.tensors and desc["dtype"] != "float32":
            qt = result.tensors[vi.name]
            desc["scale"] = [float(s) for s in qt.scale.reshape(-1)]
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
    return {"subgraphs": [{"id": k, "nodes": v} for k, v in sorted(subgraphs.items())], "cpu_nodes": cpu}


def run(result: QuantizedResult, config: Config, inputs: list[InputSpec], profile: MarchProfile,
        path: Path) -> Path:
    model = BinModel(
        name=config.model.output_model_file_prefix,
        deps=current_deps(),
        config=config.snapshot,
        inputs=input_descriptors(config, inputs, profile),
        outputs=output_descriptors(result),
        graph=result.model.SerializeToString(),
        partition=partition_record(result),
        deleted_nodes=[],
        perf=None,
        meta={"march": profile.name, "board": profile.board},
    )
    model = remove_edge_nodes(model, config.model.remove_node_type, config.model.remove_node_name,
                              until_stable=config.model.fast_perf)
    write_bin(path, [model])
    return path
