"""One onnxruntime ``quantize_static`` run done the way a careful user does it: the peer
side of ``compare_ort.py``, run there in its own process.

    python benchmarks/ort_peer.py --model float.onnx --out quant.onnx --method MinMax \\
        --data DIR --input-name x --shape 1x3x48x192 --mean 127.5 --scale 0.0078431373

Before quantizing, the float model gets the fixes listed in ``FIXES`` (without them
onnxruntime either fails or quietly quantizes less than asked). Calibration feeds the
uint8 BGR NCHW files of ``--data`` normalised as ``(x - mean) * scale`` in float32,
which is what the float model expects. On success the timings go to ``--report``
(JSON); on failure the process exits non-zero with the error as its last stderr line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import version_converter
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process

TARGET_OPSET = 13
FIXES = (
    "dynamic input dims fixed to the benchmark's input shape",
    f"onnx.version_converter to opset {TARGET_OPSET} (per-channel QDQ writes DequantizeLinear "
    "with an axis attribute that opset 11/12 lack: the ONNX checker rejects the result and "
    "onnxruntime will not load it)",
    "quant_pre_process(skip_symbolic_shape=True) (without it BatchNormalization stays unfolded; "
    "with its symbolic shape inference it raises on these Paddle2ONNX exports)",
)
# S8S8 is quantize_static's default and what onnxruntime recommends for QDQ on x86;
# int8 activations are the BPU's base width too. QInt16 (--activation-type) shows ORT
# with wider activations (onnxruntime then moves the model to opset 21).
SETTINGS = {
    "quant_format": "QDQ",
    "per_channel": True,
    "weight_type": "QInt8",
    "activation_type": "QInt8",
    "other options": "onnxruntime defaults (asymmetric activations; Percentile 99.999 "
    "on 2048 bins, symmetric; Entropy 128 bins, 128 quantized bins)",
}


class UInt8Reader(CalibrationDataReader):
    """Feeds raw uint8 NCHW files as ``(x - mean) * scale`` float32; supports ``set_range``
    so that ``CalibStridedMinMax`` can calibrate in chunks."""

    def __init__(self, files: list[Path], input_name: str, shape: tuple[int, ...],
                 mean: np.ndarray, scale: np.ndarray) -> None:
        self.files, self.name, self.shape = files, input_name, shape
        self.mean, self.scale = mean, scale
        self.set_range(0, len(files))

    def __len__(self) -> int:
        return len(self.files)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._next, self._end = start_index, min(end_index, len(self.files))

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= self._end:
            return None
        raw = np.fromfile(self.files[self._next], np.uint8).reshape(self.shape)
        self._next += 1
        return {self.name: ((raw.astype(np.float32) - self.mean) * self.scale).astype(np.float32)}


def channel_vector(values: list[float], channels: int) -> np.ndarray:
    """Per-channel mean or scale broadcastable over NCHW (one value means all channels)."""
    if len(values) not in (1, channels):
        raise ValueError(f"expected 1 or {channels} values, got {len(values)}")
    return np.broadcast_to(np.asarray(values, np.float32), (channels,)).reshape(1, channels, 1, 1).copy()


def fix_input_shape(model: onnx.ModelProto, input_name: str, shape: tuple[int, ...]) -> None:
    dims = next(i for i in model.graph.input if i.name == input_name).type.tensor_type.shape.dim
    if len(dims) != len(shape):
        raise ValueError(f"input '{input_name}' has rank {len(dims)}, the shape given has {len(shape)} dims")
    for dim, value in zip(dims, shape, strict=True):
        dim.Clear()
        dim.dim_value = value


def prepare(model_path: Path, work: Path, input_name: str, shape: tuple[int, ...]) -> Path:
    """The float model with ``FIXES`` applied, saved in ``work``."""
    model = onnx.load(str(model_path))
    fix_input_shape(model, input_name, shape)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < TARGET_OPSET:
        model = version_converter.convert_version(model, TARGET_OPSET)
    fixed = work / "fixed.onnx"
    onnx.save(model, str(fixed))
    prepared = work / "prepared.onnx"
    quant_pre_process(str(fixed), str(prepared), skip_symbolic_shape=True)
    return prepared


def quantize(prepared: Path, out: Path, reader: UInt8Reader, method: str, stride: int,
             activation_type: str = "QInt8") -> None:
    extra = {"CalibStridedMinMax": stride} if stride else {}
    quantize_static(str(prepared), str(out), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType[activation_type], weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod[method], extra_options=extra)


def validate(out: Path) -> None:
    """An invalid model is a failed run: it must pass the checker and load in onnxruntime."""
    try:
        onnx.checker.check_model(str(out))
        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise RuntimeError(f"invalid quantized model: {type(exc).__name__}: {exc}") from exc


def parse_floats(text: str) -> list[float]:
    return [float(v) for v in text.replace(",", " ").split()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="float ONNX model")
    parser.add_argument("--out", type=Path, required=True, help="quantized QDQ model to write")
    parser.add_argument("--method", required=True, choices=["MinMax", "Percentile", "Entropy"])
    parser.add_argument("--data", type=Path, required=True, help="folder of uint8 NCHW calibration files")
    parser.add_argument("--input-name", required=True)
    parser.add_argument("--shape", required=True, help="NxCxHxW")
    parser.add_argument("--mean", required=True, help="one value or one per channel")
    parser.add_argument("--scale", required=True, help="one value or one per channel")
    parser.add_argument("--stride", type=int, default=0,
                        help="CalibStridedMinMax: calibrate in chunks of this many samples (0: all at once)")
    parser.add_argument("--activation-type", default="QInt8", choices=["QInt8", "QUInt8", "QInt16"])
    parser.add_argument("--report", type=Path, help="write step timings here (JSON)")
    args = parser.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.lower().split("x"))
    files = sorted(p for p in args.data.iterdir() if p.is_file())
    reader = UInt8Reader(files, args.input_name, shape, channel_vector(parse_floats(args.mean), shape[1]),
                         channel_vector(parse_floats(args.scale), shape[1]))
    with tempfile.TemporaryDirectory(prefix="ort_peer_") as tmp:
        start = time.perf_counter()
        prepared = prepare(args.model, Path(tmp), args.input_name, shape)
        prepared_at = time.perf_counter()
        quantize(prepared, args.out, reader, args.method, args.stride, args.activation_type)
        quantized_at = time.perf_counter()
    validate(args.out)
    if args.report:
        args.report.write_text(json.dumps({"prepare_s": round(prepared_at - start, 2),
                                           "quantize_s": round(quantized_at - prepared_at, 2)}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:
        # The caller reports the last stderr line; keep the traceback above it for reading.
        import traceback

        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}" if str(exc).strip() else type(exc).__name__
        print("ERROR " + message.strip().splitlines()[0], file=sys.stderr)
        sys.exit(1)
