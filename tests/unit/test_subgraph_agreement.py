"""One BPU/CPU partition: makertbin's table, the checker, the .bin, hb_perf, the profiler and the
structure picture all give the same subgraphs, also where a node linked to the first BPU part can
only run after a CPU node (it starts a new subgraph)."""

from __future__ import annotations

import re

from bin_fixtures import invoke, subgraph_counts
from builders import bpu_cpu_bpu, make_project

from hbtools.cli import hb_mapper
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.structure import analyse, tensor_info

ROW = re.compile(r"^(\S+)\s+(BPU|CPU)\s+(id\(\d+\)|--)\s+(\S+)", re.M)


def table(output: str) -> dict[str, str]:
    """Node -> ``id(k)`` / ``--`` of the node table in a checker or makertbin output."""
    start = output.index("The converted model node information")
    return {m.group(1): m.group(3) for m in ROW.finditer(output[start:])}


def test_all_tools_agree_on_bpu_cpu_bpu(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", bpu_cpu_bpu(), cal_count=2)
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    checked = invoke(hb_mapper.main, ["checker", "--model-type", "onnx", "--march", "bayes-e",
                                      "--model", project.model_path])
    assert checked.exit_code == 0, checked.output
    rows = table(made.output)
    assert rows == table(checked.output)
    # Concat_0 reads Relu_0 (first part) and Conv_2 (behind the CPU LRN): second subgraph
    assert (rows["Conv_1"], rows["LRN_0"], rows["Conv_2"], rows["Concat_0"]) == ("id(0)", "--", "id(1)", "id(1)")
    assert "The model has 2 BPU subgraph(s)" in checked.output
    counts = subgraph_counts(project.artefact("bin"), tmp_path)
    assert set(counts.values()) == {2}, counts
    assert "The model has 2 BPU subgraph(s)" in made.output
    rm = open_model(project.artefact("bin"))
    structure = analyse(rm.graph, rm.bin.partition, tensor_info(rm.graph))
    nodes = list(rm.graph.graph.node)
    by_name = {n.name: structure.subgraph_of.get(i) for i, n in enumerate(nodes)}
    assert (by_name["Conv_1"], by_name["Conv_2"], by_name["Concat_0"]) == (0, 1, 1)


def test_branches_reading_one_featuremap_input_are_one_subgraph(tmp_path, monkeypatch) -> None:
    """Two convolutions reading a featuremap input (a StyleGAN-like generator's input conv beside its encoder) were
    two BPU subgraphs in makertbin and the .bin, where the checker said one: the input's quantization is a CPU node
    of the quantized model, and the BPU nodes after it were linked to nothing (hunt 20 D5). One call takes both."""
    from builders import _Graph

    g = _Graph(3)
    fm = g.model({"data": [1, 3, 16, 16]}, [g.conv("data", 3, 8), g.conv("data", 3, 4)], featuremap={"data"})
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", fm, cal_count=2)
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    assert "The model has 1 BPU subgraph(s)" in made.output, made.output[-2000:]
    assert set(table(made.output).values()) == {"id(0)"}, table(made.output)
    counts = subgraph_counts(project.artefact("bin"), tmp_path)
    assert set(counts.values()) == {1}, counts
