"""Tables and the where-we-stand summary of compare_ort.py's results (pure functions)."""

from __future__ import annotations

import argparse
import math

import ort_peer

from hbtools.eval import DET_THRESH

AGREEMENT = {
    "cls": "same class (argmax)",
    "det": f"pixels on the same side of {DET_THRESH} (DBPostProcess thresh), all held-out pictures pooled",
    "rec": "identical greedy-CTC strings",
}
COLUMN = {"cls": "same class", "det": f"pixels @{DET_THRESH} (IoU)", "rec": "same string"}
# Metric, better direction, tolerance under which a difference counts as a tie (timings are
# noisy on a shared machine; cosines are shown to 4 decimals).
METRICS = (
    ("cosine_mean", "higher", 1e-4),
    ("cosine_min", "higher", 1e-4),
    ("agreement", "higher", 1e-9),
    ("wall_s", "lower", 0.05),
    ("peak_rss_mb", "lower", 0.05),
    ("infer_ms", "lower", 0.05),
)
ERROR_CHARS = 200
NOTES = [
    "The machine's cores are shared with other people's jobs (see the load averages): "
    "wall and inference times are indicative, accuracy figures are exact.",
    "Quantization runs one after the other, never two at once; each uses onnxruntime's default "
    "thread count for calibration.",
    "Our quantized ONNX is the bit-exact integer emulation of the BPU model (ConvInteger/MatMulInteger "
    "with float64 requantization), not a CPU deployment format: its ms/sample measures the "
    "emulation, not the board. onnxruntime fuses its QDQ model into int8 CPU kernels.",
]


def stride_for(cal_num: int, stride: int) -> int:
    """Largest divisor of ``cal_num`` not above ``stride`` (CalibStridedMinMax needs one);
    0 when no retry is wanted or the chunk would be the whole set."""
    if stride <= 0:
        return 0
    best = max(d for d in range(1, min(stride, cal_num) + 1) if cal_num % d == 0)
    return best if best < cal_num else 0


def settings(args: argparse.Namespace) -> dict:
    return {
        "calibration_samples": args.cal_num,
        "heldout_samples": args.heldout_num,
        "memory_cap_gb": args.mem_limit_gb,
        "memory_cap": "RLIMIT_AS (address space) of each quantization process, ours included",
        "timeout_min": args.timeout_min,
        "peak_rss": "ru_maxrss of the quantization process from wait4 (one process per run)",
        "wall_time": "ours: the whole hb_mapper makertbin (parse to .bin); ORT: the fixes, "
                     "quant_pre_process, quantize_static and the validity check",
        "inference": "median over the held-out samples (each the best of 3 runs when one run takes "
                     f"under 0.2 s), onnxruntime CPU, {args.threads or 'default'} intra-op "
                     "thread(s), same session options for the float and the quantized model, run "
                     "alternately; ours runs <prefix>_quantized_model.onnx through HB_ONNXRuntime "
                     "(uint8 input, input_offset 128), ORT its QDQ model (float input)",
        "reference": "the source float model on (x - mean) * scale of the same uint8 samples",
        "ours": "hb_mapper makertbin, configs/ppocr_<model>.yaml with calibration_type: default "
                "and the benchmark's data and input shape",
        "onnxruntime": {**ort_peer.SETTINGS, "activation_type": args.activation_type},
        "onnxruntime_fixes": list(ort_peer.FIXES),
        "retry": f"a failed Percentile/Entropy run is retried with CalibStridedMinMax="
                 f"{stride_for(args.cal_num, args.stride) or 'off'} (calibration in chunks, histograms merged)",
    }


def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(value, spec)


def _agreement_cell(row: dict) -> str:
    if row.get("agreement") is None:
        return "—"
    cell = f"{100 * row['agreement']:.1f} %"
    if row.get("iou") is not None:
        cell += f" ({row['iou']:.3f})"
    return cell


def _infer_cell(row: dict) -> str:
    if row.get("infer_ms") is None:
        return "—"
    return f"{row['infer_ms']:.1f} ({row['infer_ms'] / row['float_ms']:.2f}×)"


def _status_cell(row: dict) -> str:
    if row["status"] == "ok":
        return "ok"
    return "**failed**: " + shorten(row["error"]).replace("|", "\\|")


def shorten(error: str, limit: int = ERROR_CHARS) -> str:
    """Head and tail of a long error: onnxruntime puts the cause after a long preamble."""
    if len(error) <= limit:
        return error
    head = limit // 3
    return error[:head].rstrip() + " … " + error[-(limit - head - 3):].lstrip()


def _tool_cell(row: dict) -> str:
    if row.get("activations"):
        return (f"{row['tool']}: {row['calibration_method']}, {row['int16_activations']} of "
                f"{row['activations']} activations int16")
    return row["tool"]


def progress_line(model: str, row: dict) -> str:
    if row["status"] != "ok":
        return f"{model} {row['tool']}: FAILED after {row['wall_s']} s ({row['error']})"
    return (f"{model} {row['tool']}: {row['wall_s']} s, {row['peak_rss_mb']} MB, cosine "
            f"{row['cosine_mean']:.4f}/{row['cosine_min']:.4f}, agreement {row['agreement']:.3f}, "
            f"{row['infer_ms']:.1f} ms vs float {row['float_ms']:.1f} ms")


def standing(model: dict) -> dict:
    """Ours against onnxruntime: its best run by held-out cosine mean, and every metric on
    which some successful ORT run beats ours by more than the tie tolerance."""
    ours = model["runs"][0]
    peers = [r for r in model["runs"][1:] if r["status"] == "ok"]
    out: dict = {"best_peer": None, "behind": [], "ahead": []}
    if ours["status"] != "ok" or not peers:
        return out
    out["best_peer"] = max(peers, key=lambda r: r["cosine_mean"])["tool"]
    for metric, direction, tol in METRICS:
        sign = 1 if direction == "higher" else -1
        best = max(peers, key=lambda r: sign * r[metric])
        margin = tol if direction == "higher" else tol * ours[metric]
        entry = {"metric": metric, "ours": ours[metric], "onnxruntime": best[metric], "onnxruntime_run": best["tool"]}
        if sign * (best[metric] - ours[metric]) > margin:
            out["behind"].append(entry)
        elif sign * (ours[metric] - best[metric]) > margin:
            out["ahead"].append(entry)
    return out


def _summary_line(model: dict, activation_type: str) -> str:
    summary = standing(model)
    if summary["best_peer"] is None:
        ours_failed = model["runs"][0]["status"] != "ok"
        return "No comparison: " + ("our run failed." if ours_failed else "every ORT run failed.")
    best = next(r for r in model["runs"] if r["tool"] == summary["best_peer"])
    ours = model["runs"][0]
    width = (f" with {ours['int16_activations']} of {ours['activations']} activation tensors in int16 "
             f"(ORT: all {activation_type})" if ours.get("int16_activations") else "")
    text = (f"Ours{width}: cosine {ours['cosine_mean']:.4f} (min {ours['cosine_min']:.4f}), agreement "
            f"{_agreement_cell(ours)}. onnxruntime's best by cosine, {best['tool']}: {best['cosine_mean']:.4f} "
            f"(min {best['cosine_min']:.4f}), agreement {_agreement_cell(best)}. ")
    if summary["behind"]:
        text += "We are behind on " + "; ".join(
            f"{e['metric']} ({e['ours']:.4g} vs {e['onnxruntime']:.4g}, {e['onnxruntime_run']})"
            for e in summary["behind"]) + "."
    else:
        text += "We are behind on nothing measured."
    return text


def model_table(model: dict, activation_type: str = "QInt8") -> str:
    name = model["model"]
    shape = "x".join(map(str, model["input_shape"]))
    held = model["heldout_samples"]
    over = (f"the {model['cosine_samples']} of {held} held-out pictures whose float map has text"
            if name == "det" else f"all {held} held-out samples")
    lines = [
        f"### {name}: {model['source']}, input {shape}",
        "",
        f"{model['calibration_samples']} calibration samples; cosine over {over}; agreement: {model['agreement']}.",
        "",
        f"| run | wall s | peak RSS MB | cosine mean | cosine min | {COLUMN[name]} | ms/sample (× float) | status |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for row in model["runs"]:
        lines.append(f"| {_tool_cell(row)} | {row['wall_s']:.1f} | {row['peak_rss_mb']} | "
                     f"{_fmt(row.get('cosine_mean'), '.4f')} | {_fmt(row.get('cosine_min'), '.4f')} | "
                     f"{_agreement_cell(row)} | {_infer_cell(row)} | {_status_cell(row)} |")
    return "\n".join([*lines, "", _summary_line(model, activation_type), ""])


def markdown(result: dict) -> str:
    m = result["machine"]
    load = "/".join(f"{v:.1f}" for v in result["load_average_at_start"])
    peer = result["settings"]["onnxruntime"]
    head = [
        "## hb_mapper makertbin vs onnxruntime quantize_static",
        "",
        f"{m['date']}, {m['cpu']} ({m['cores']} cores, {m['ram_gb']} GB RAM), Python {m['python']}, "
        f"onnxruntime {m['onnxruntime']}, onnx {m['onnx']}. Load average at start {load} "
        "(the machine is shared: timings are indicative).",
        "",
        f"`{result['command']}`",
        "",
        "ORT runs: " + ", ".join(f"{k} {v}" for k, v in peer.items() if k != "other options")
        + "; fixes applied first: " + "; ".join(ort_peer.FIXES) + ".",
        "",
    ]
    return "\n".join(head + [model_table(model, peer["activation_type"]) for model in result["models"]])
