"""hrt_model_exec on the x86 simulator: model_info, infer and perf.

Times are measured on this host while the simulator runs; they describe the
simulation, not the board (hb_perf estimates the board). The report layout
follows the board tool's (seed 004 §Model Performance Analysis).
"""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import ModelProto

from hbtools import outputs
from hbtools.graph.graph import GraphView
from hbtools.ops.base import attrs_of
from hbtools.runtime.binfile import BinFile
from hbtools.runtime.rt_input import rt_dtype, rt_shape
from hbtools.runtime.runtime_model import InputDesc, OutputDesc, RuntimeModel, load
from hbtools.runtime.simulator import Simulator
from hbtools.tools.model_info import TENSOR_TYPES
from hbtools.tools.modifier import descriptor_scale, descriptor_zero_point, scale_lines

_IMG_TYPE = {"nv12": "HB_DNN_IMG_TYPE_NV12", "yuv444": "HB_DNN_IMG_TYPE_YUV444", "rgb": "HB_DNN_IMG_TYPE_RGB",
             "bgr": "HB_DNN_IMG_TYPE_BGR", "gray": "HB_DNN_IMG_TYPE_Y"}


def _shape_text(shape: tuple) -> str:
    return "(" + "".join(f"{d if d is not None else '?'}," for d in shape) + ")"


def _strides(shape: tuple, itemsize: int) -> tuple:
    if any(d is None for d in shape):
        return tuple(0 for _ in shape)
    return tuple(int(np.prod(shape[k + 1:], dtype=np.int64)) * itemsize for k in range(len(shape)))


@dataclass(frozen=True)
class BoardTensor:
    """An input or output as the board runtime describes it (hbDNNTensorProperties)."""

    valid_shape: tuple
    layout: str  # NCHW | NHWC | NONE
    tensor_type: str  # HB_DNN_IMG_TYPE_* or HB_DNN_TENSOR_TYPE_*
    byte_size: int
    stride: tuple
    scale: tuple[float, ...] = ()
    quantize_axis: int = 0
    zero_point: int = 0

    def lines(self) -> list[str]:
        # hbtools lays tensors out without padding, so the aligned shape is the valid shape.
        out = [f"valid shape: {_shape_text(self.valid_shape)}", f"aligned shape: {_shape_text(self.valid_shape)}",
               f"aligned byte size: {self.byte_size}", f"tensor type: {self.tensor_type}",
               f"tensor layout: HB_DNN_LAYOUT_{self.layout}", f"quanti type: {'SCALE' if self.scale else 'NONE'}",
               f"stride: {_shape_text(self.stride)}"]
        return out + (scale_lines(self.scale, self.quantize_axis, self.zero_point) if self.scale else [])


def _layout(shape: tuple, layout: str | None = None) -> str:
    if len(shape) != 4:
        return "NONE"
    return layout if layout in ("NCHW", "NHWC") else "NCHW"


def board_input(d: InputDesc) -> BoardTensor:
    """An input in the board's terms: nv12 is (N,3,H,W) NCHW with zero strides, images are uint8
    in the model input's layout, featuremaps carry their dtype (and scale once their Quantize is gone)."""
    if d.type_rt == "nv12":
        (h, w), n = d.hw, d.shape[0]
        return BoardTensor((n, 3, h, w), "NCHW", _IMG_TYPE["nv12"], n * h * w * 3 // 2, (0, 0, 0, 0))
    dtype = rt_dtype(d)
    size = int(np.prod(rt_shape(d))) * dtype.itemsize
    stride = _strides(d.shape, dtype.itemsize)
    if d.is_image:
        return BoardTensor(d.shape, _layout(d.shape, d.layout), _IMG_TYPE[d.type_rt], size, stride)
    scale, axis = descriptor_scale(d.raw) if np.issubdtype(dtype, np.integer) else ((), 0)
    tensor = f"HB_DNN_TENSOR_TYPE_{TENSOR_TYPES.get(str(dtype), 'F32')}"
    return BoardTensor(d.shape, _layout(d.shape, d.layout), tensor, size, stride, scale, axis,
                       descriptor_zero_point(d.raw) if scale else 0)


def board_output(o: OutputDesc, raw: dict, layout: str | None = None) -> BoardTensor:
    size = int(np.prod([d or 0 for d in o.shape])) * o.dtype.itemsize
    scale, axis = descriptor_scale(raw) if np.issubdtype(o.dtype, np.integer) else ((), 0)
    return BoardTensor(o.shape, _layout(o.shape, layout),
                       f"HB_DNN_TENSOR_TYPE_{TENSOR_TYPES.get(str(o.dtype), 'F32')}", size,
                       _strides(o.shape, o.dtype.itemsize), scale, axis, descriptor_zero_point(raw) if scale else 0)


def output_layouts(graph: ModelProto) -> dict[str, str]:
    """Per model output: NHWC for a 4-D output a Transpose to channels last wrote (behind its Dequantize or a Cast:
    the head maps of RDK-style YOLO exports, ``permute(0, 2, 3, 1)``, which board code reads as NHWC), else NCHW."""
    producer = GraphView(graph).producer
    found = {}
    for out in graph.graph.output:
        node = producer.get(out.name)
        while node is not None and node.op_type in ("HzDequantize", "Cast", "Identity"):
            node = producer.get(node.input[0])
        perm = list(attrs_of(node).get("perm", [])) if node is not None and node.op_type == "Transpose" else []
        found[out.name] = "NHWC" if perm == [0, 2, 3, 1] else "NCHW"
    return found


def _input_lines(k: int, d: InputDesc) -> list[str]:
    return [f"input[{k}]: ", f"name: {d.name}", f"input source: HB_DNN_INPUT_FROM_{d.source.upper()}",
            *board_input(d).lines(), ""]


def _output_lines(k: int, o: OutputDesc, raw: dict, layout: str) -> list[str]:
    return [f"output[{k}]: ", f"name: {o.name}", *board_output(o, raw, layout).lines(), ""]


def model_info(f: BinFile, name: str | None) -> list[str]:
    """The board tool's model_info listing: inputs and outputs of one or every model."""
    models = [f.model(name)] if name else f.models
    lines = [f"This model file has {len(f.models)} model{'s' if len(f.models) > 1 else ''}:",
             "".join(f"[{m.name}]" for m in f.models)]
    for m in models:
        rm = load(m, f.path)
        lines += ["-" * 69, f"[model name]: {m.name}", ""]
        for k, d in enumerate(rm.inputs):
            lines += _input_lines(k, d)
        described = {d["name"]: d for d in m.outputs if isinstance(d.get("name"), str)}
        layouts = output_layouts(rm.graph)
        for k, o in enumerate(rm.outputs):
            lines += _output_lines(k, o, described.get(o.name, {}), layouts.get(o.name, "NCHW"))
    lines.append("-" * 69)
    return lines


@dataclass
class PerfRun:
    thread_num: int
    frames: int
    run_time_ms: float
    latencies_ms: list[float]
    per_label_ms: dict[str, list[float]] = field(default_factory=dict)  # per frame, summed over steps

    @property
    def total_latency_ms(self) -> float:
        return float(sum(self.latencies_ms))

    @property
    def average_ms(self) -> float:
        return self.total_latency_ms / self.frames if self.frames else 0.0

    @property
    def fps(self) -> float:
        return self.frames * 1000.0 / self.run_time_ms if self.run_time_ms else 0.0


def perf(sim: Simulator, feeds: dict[str, np.ndarray], frame_count: int, thread_num: int,
         perf_time_min: float = 0.0, budget_s: float | None = None) -> PerfRun:
    """Run frames on ``thread_num`` threads: ``frame_count`` in all, or for ``perf_time_min`` minutes; with
    ``budget_s``, no frame starts after that many seconds (at least one runs)."""
    prepared = sim.prepare(feeds)
    lock = threading.Lock()
    claimed = [0]
    results: list[tuple[float, dict[str, list[float]]]] = []
    deadline = time.perf_counter() + perf_time_min * 60.0 if perf_time_min > 0 else None
    cutoff = time.perf_counter() + budget_s if budget_s is not None else None
    stop = threading.Event()  # Ctrl-C: the workers finish their frame and take no more

    def more() -> bool:
        with lock:
            if stop.is_set() or deadline is None and claimed[0] >= frame_count:
                return False
            if cutoff is not None and claimed[0] > 0 and time.perf_counter() >= cutoff:
                return False
            claimed[0] += 1
            return deadline is None or time.perf_counter() < deadline

    def worker() -> None:
        while more():
            timings: dict[str, list[float]] = {}
            start = time.perf_counter()
            sim.run(prepared, prepared=True, timings=timings)
            latency = (time.perf_counter() - start) * 1000.0
            with lock:
                results.append((latency, timings))

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=thread_num) as pool:
        futures = [pool.submit(worker) for _ in range(thread_num)]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            # Leaving the pool waits for its workers: without the stop they ran every remaining frame
            # (minutes after a Ctrl-C) before the interrupt was reported.
            stop.set()
            raise
    run_time = (time.perf_counter() - start) * 1000.0
    per_label: dict[str, list[float]] = {}
    for _, timings in results:
        for label, values in timings.items():
            per_label.setdefault(label, []).append(sum(values))
    return PerfRun(thread_num, len(results), run_time, [lat for lat, _ in results], per_label)


def perf_report(run: PerfRun, core_num: int) -> list[str]:
    return ["Running condition:", f"  Thread number is: {run.thread_num}", f"  Frame count   is: {run.frames}",
            f"  core number   is: {core_num}", f"  Program run time: {run.run_time_ms:.6f} ms", "Perf result:",
            f"  Frame totally latency is: {run.total_latency_ms:.6f} ms",
            f"  Average    latency    is: {run.average_ms:.6f} ms",
            f"  Frame      rate       is: {run.fps:.6f} FPS"]


def _stats(values: list[float]) -> dict[str, float]:
    return {"avg_time": float(np.mean(values)), "max_time": float(np.max(values)), "min_time": float(np.min(values))}


def write_profile(folder: Path, run: PerfRun, rm: RuntimeModel, core_id: int) -> tuple[Path, Path]:
    """profiler.log (JSON, the board tool's keys) and profiler.csv (one row per model part)."""
    folder.mkdir(parents=True, exist_ok=True)
    model_latency = {label: _stats(v) for label, v in sorted(run.per_label_ms.items())}
    frames = range(run.frames)
    bpu = [sum(v[i] for k, v in run.per_label_ms.items() if k.startswith("BPU_")) for i in frames]
    cpu = [sum(v[i] for k, v in run.per_label_ms.items() if not k.startswith("BPU_")) for i in frames]
    doc = {
        "perf_result": {"FPS": run.fps, "average_latency": run.average_ms},
        "running_condition": {"core_id": core_id, "frame_count": run.frames, "model_name": rm.name,
                              "run_time": run.run_time_ms, "thread_num": run.thread_num},
        "chip_latency": {"BPU_inference_time_cost": _stats(bpu), "CPU_inference_time_cost": _stats(cpu)}
        if run.frames else {},
        "model_latency": model_latency,
        "task_latency": {"TaskRunningTime": _stats(run.latencies_ms)} if run.frames else {},
        "note": "measured on the hbtools x86 simulator, not on a board",
    }
    log_path, csv_path = folder / "profiler.log", folder / "profiler.csv"
    outputs.write_file(log_path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["name", "avg_time(ms)", "max_time(ms)", "min_time(ms)"])
    for label, s in model_latency.items():
        writer.writerow([label, f"{s['avg_time']:.6f}", f"{s['max_time']:.6f}", f"{s['min_time']:.6f}"])
    outputs.write_file(csv_path, buffer.getvalue().encode("utf-8"))
    return log_path, csv_path


def dump_layers(rm: RuntimeModel) -> list:
    """The conv layers a ``layer_out_dump: True`` model recorded (``quant.layer_dump``); [] otherwise."""
    from hbtools.quant.layer_dump import recorded_layers

    if not rm.bin.meta.get("layer_out_dump"):
        return []
    outputs = {o.name for o in rm.outputs}
    return [layer for layer in recorded_layers(rm.graph) or [] if layer.tensor not in outputs]


def write_layers(folder: Path, layers: list, values: dict[str, np.ndarray]) -> list[Path]:
    """Each layer as float32 ``<layer>_float.bin``, the name ``hb_mapper infer`` gives it, so vec_diff pairs them."""
    from hbtools.tools.infer import layer_files

    folder.mkdir(parents=True, exist_ok=True)
    present = [layer for layer in layers if layer.tensor in values]
    files = layer_files(present)
    for layer in present:
        outputs.write_array(folder / files[layer.name], layer.to_float(values[layer.tensor]))
    return [folder / file for file in files.values()]


def dump_output(folder: Path, index: int, name: str, value: np.ndarray, fmt: str, txt_axis: int) -> Path:
    """One output as ``model_infer_output_<i>_<name>.<bin|txt|npy>``."""
    outputs.output_dir(folder, "--dump_path")
    # the index keeps the outputs' files apart: only a name too long for a file name changes
    path = folder / outputs.file_names([name], prefix=f"model_infer_output_{index}_", suffix=f".{fmt}",
                                       fallback="output")[name]
    if fmt == "bin":
        outputs.write_array(path, value)
        return path
    buffer = io.BytesIO()  # formatted in memory, then written whole (see outputs.write_file)
    if fmt == "npy":
        np.save(buffer, value)
    else:
        axis = txt_axis % value.ndim if value.ndim else 0
        rows = value.reshape(int(np.prod(value.shape[:axis], dtype=np.int64)), -1) if value.ndim else value[None, None]
        np.savetxt(buffer, rows, fmt="%d" if np.issubdtype(value.dtype, np.integer) else "%.6f")
    return outputs.write_file(path, buffer.getvalue())


def top_classes(value: np.ndarray, count: int = 5) -> list[tuple[int, float]] | None:
    """``--enable_cls_post_process``: the ``count`` best (class id, score) of a classifier's output, best
    first; None when the output is not one vector of class scores (a feature map, boxes, a batch)."""
    if sum(d > 1 for d in value.shape) > 1:
        return None
    scores = np.asarray(value, dtype=np.float64).reshape(-1)
    return [(int(i), float(scores[i])) for i in np.argsort(-scores, kind="stable")[:count]]
