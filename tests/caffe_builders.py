"""Small Caffe networks for the tests: prototxt text, caffemodel bytes and a numpy forward pass.

``CaffeNet`` writes layers the way a Caffe user does (parameters as prototxt text),
stores weights in the layers' blobs, and computes every layer's result in float64
numpy following Caffe's definitions (written here independently of the converter:
direct convolution loops, Caffe's pooling window arithmetic, ...). The prototxt is
the net without blobs; the caffemodel is the whole net serialized, as Caffe saves it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from google.protobuf import text_format

from hbtools.frontends.caffe.proto import NetParameter

Values = dict[str, np.ndarray]


# ---------------------------------------------------------------- numpy reference


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: Sequence[int], pad: Sequence[int],
           dilation: Sequence[int], group: int) -> np.ndarray:
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    y = np.zeros((n, o, oh, ow))
    og = o // group
    for g in range(group):
        xs, ws = xp[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def deconv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: Sequence[int], pad: Sequence[int],
             dilation: Sequence[int], group: int) -> np.ndarray:
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    fh, fw = sh * (h - 1) + dh * (kh - 1) + 1, sw * (wd - 1) + dw * (kw - 1) + 1
    y = np.zeros((n, og * group, fh, fw))
    cg = c // group
    for g in range(group):
        xs, ws = x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dh, i * dh + sh * (h - 1) + 1, sh)
                cols = slice(j * dw, j * dw + sw * (wd - 1) + 1, sw)
                y[:, g * og:(g + 1) * og, rows, cols] += \
                    np.einsum("nchw,co->nohw", xs, ws[:, :, i, j])
    y = y[:, :, ph:fh - ph, pw:fw - pw]
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def pool2d(x: np.ndarray, method: str, kernel: Sequence[int], stride: Sequence[int], pad: Sequence[int],
           ceil: bool = True) -> np.ndarray:
    """Caffe's PoolingLayer forward, window by window."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    rnd = np.ceil if ceil else np.floor
    oh, ow = int(rnd((h + 2 * ph - kh) / sh)) + 1, int(rnd((w + 2 * pw - kw) / sw)) + 1
    if ph or pw:
        oh -= (oh - 1) * sh >= h + ph
        ow -= (ow - 1) * sw >= w + pw
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * sh - ph, j * sw - pw
            he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
            size = (he - hs) * (we - ws)
            win = x[:, :, max(hs, 0):min(he, h), max(ws, 0):min(we, w)]
            y[:, :, i, j] = win.max(axis=(2, 3)) if method == "MAX" else win.sum(axis=(2, 3)) / size
    return y


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def lrn(x: np.ndarray, size: int, alpha: float, beta: float, k: float, within: bool) -> np.ndarray:
    half = (size - 1) // 2
    sq = x * x
    if within:
        padded = np.pad(sq, ((0, 0), (0, 0), (half, half), (half, half)))
        acc = sum(padded[:, :, i:i + x.shape[2], j:j + x.shape[3]] for i in range(size) for j in range(size))
        return x * (1 + alpha * acc / (size * size)) ** -beta
    padded = np.pad(sq, ((0, 0), (half, half), (0, 0), (0, 0)))
    acc = sum(padded[:, i:i + x.shape[1]] for i in range(size))
    return x * (k + alpha / size * acc) ** -beta


def interp_bilinear(x: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """Bilinear resize with aligned corners (Caffe's Interp layer)."""
    def coords(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = np.arange(n_out) * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, src - lo
    h0, h1, fh = coords(x.shape[2], oh)
    w0, w1, fw = coords(x.shape[3], ow)
    top = x[:, :, h0][:, :, :, w0] * (1 - fw) + x[:, :, h0][:, :, :, w1] * fw
    bottom = x[:, :, h1][:, :, :, w0] * (1 - fw) + x[:, :, h1][:, :, :, w1] * fw
    return top * (1 - fh)[:, None] + bottom * fh[:, None]


# ---------------------------------------------------------------- network builder


class CaffeNet:
    """A Caffe network under construction, evaluated in numpy as it grows."""

    def __init__(self, name: str = "net", seed: int = 0) -> None:
        self.net = NetParameter(name=name)
        self.rng = np.random.default_rng(seed)
        self.steps: list[Callable[[Values], None]] = []
        self.inputs: dict[str, list[int]] = {}
        self.values: Values = {}  # every blob for one seeded random input: gives the shapes
        self.count = 0

    # ---- plumbing

    def layer(self, type_: str, bottoms: Sequence[str], tops: Sequence[str], params: str = "",
              blobs: Sequence[np.ndarray] = (), step: Callable[[Values], None] | None = None,
              name: str | None = None) -> str:
        self.count += 1
        layer = self.net.layer.add(name=name or f"{type_.lower()}{self.count}", type=type_)
        layer.bottom.extend(bottoms)
        layer.top.extend(tops)
        if params:
            text_format.Merge(params, layer)
        for blob in blobs:
            proto = layer.blobs.add()
            proto.shape.dim.extend(blob.shape)
            proto.data.extend(np.asarray(blob, np.float32).ravel().tolist())
        if step is not None:
            self.steps.append(step)
            step(self.values)
        return tops[0] if tops else ""

    def shape(self, blob: str) -> tuple[int, ...]:
        return self.values[blob].shape

    def randn(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        return (scale * self.rng.standard_normal(shape)).astype(np.float32)

    def forward(self, feeds: Values) -> Values:
        values = {k: np.asarray(v, np.float64) for k, v in feeds.items()}
        for step in self.steps:
            step(values)
        return values

    def sample(self, seed: int = 1) -> Values:
        rng = np.random.default_rng(seed)
        return {k: rng.standard_normal(s).astype(np.float32) for k, s in self.inputs.items()}

    def prototxt(self) -> str:
        bare = NetParameter()
        bare.CopyFrom(self.net)
        for layer in bare.layer:
            del layer.blobs[:]
        return text_format.MessageToString(bare)

    def write(self, folder: Path, stem: str = "net") -> tuple[Path, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        proto, model = folder / f"{stem}.prototxt", folder / f"{stem}.caffemodel"
        proto.write_text(self.prototxt())
        model.write_bytes(self.net.SerializeToString())
        return proto, model

    # ---- inputs

    def input(self, name: str, shape: Sequence[int], form: str = "layer") -> str:
        """``form``: an Input layer, or the net-level ``input`` with ``input_shape`` / ``input_dim``."""
        shape = [int(d) for d in shape]
        if form == "layer":
            dims = " ".join(f"dim: {d}" for d in shape)
            self.layer("Input", [], [name], f"input_param {{ shape {{ {dims} }} }}", name=name)
        elif form == "input_shape":
            self.net.input.append(name)
            self.net.input_shape.add().dim.extend(shape)
        else:
            self.net.input.append(name)
            self.net.input_dim.extend(shape)
        self.inputs[name] = shape
        self.values[name] = self.rng.standard_normal(shape)
        return name

    # ---- layers with weights

    def conv(self, bottom: str, cout: int, k: int, stride: int = 1, pad: int = 0, group: int = 1,
             dilation: int = 1, bias: bool = True, top: str | None = None, deconv: bool = False) -> str:
        c = self.shape(bottom)[1]
        wshape = (c, cout // group, k, k) if deconv else (cout, c // group, k, k)
        w = self.randn(*wshape, scale=1 / np.sqrt(c * k * k / group))
        b = self.randn(cout, scale=0.1) if bias else None
        top = top or f"{'deconv' if deconv else 'conv'}{self.count + 1}"
        params = (f"convolution_param {{ num_output: {cout} kernel_size: {k} stride: {stride} pad: {pad} "
                  f"group: {group} dilation: {dilation} bias_term: {'true' if bias else 'false'} "
                  f"weight_filler {{ type: \"msra\" }} }}")
        fn = deconv2d if deconv else conv2d

        def step(v: Values) -> None:
            v[top] = fn(v[bottom], w, b, (stride, stride), (pad, pad), (dilation, dilation), group)
        blobs = [w] if b is None else [w, b]
        return self.layer("Deconvolution" if deconv else "Convolution", [bottom], [top], params, blobs, step)

    def inner_product(self, bottom: str, n: int, axis: int = 1, transpose: bool = False, bias: bool = True) -> str:
        shape = self.shape(bottom)
        ax = axis % len(shape)
        k = int(np.prod(shape[ax:]))
        w = self.randn(n, k, scale=1 / np.sqrt(k))
        b = self.randn(n, scale=0.1)
        top = f"fc{self.count + 1}"

        def step(v: Values) -> None:
            x = v[bottom].reshape(*v[bottom].shape[:ax], k)
            v[top] = x @ w.T.astype(np.float64) + (b if bias else 0)
        blobs = [w.T.copy() if transpose else w] + ([b] if bias else [])
        params = (f"inner_product_param {{ num_output: {n} axis: {axis} transpose: {str(transpose).lower()} "
                  f"bias_term: {str(bias).lower()} }}")
        return self.layer("InnerProduct", [bottom], [top], params, blobs, step)

    def batch_norm(self, bottom: str, eps: float = 1e-5, factor: float = 2.0) -> str:
        """In place, with Caffe's running sums (the statistics times ``factor``) in the blobs."""
        c = self.shape(bottom)[1]
        mean, var = self.randn(c, scale=0.3), self.rng.uniform(0.5, 2.0, c).astype(np.float32)

        def step(v: Values) -> None:
            shape = (1, c) + (1,) * (v[bottom].ndim - 2)
            v[bottom] = (v[bottom] - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + np.float32(eps))
        blobs = [mean * factor, var * factor, np.array([factor], np.float32)]
        return self.layer("BatchNorm", [bottom], [bottom], f"batch_norm_param {{ eps: {eps} }}", blobs, step)

    def scale(self, bottom: str, bias: bool = True, axis: int = 1, num_axes: int = 1) -> str:
        shape = self.shape(bottom)
        covered = shape[axis:] if num_axes == -1 else shape[axis:axis + num_axes]
        gamma = self.rng.uniform(0.5, 1.5, covered).astype(np.float32)
        beta = self.randn(*covered, scale=0.1)
        trailing = (1,) * (len(shape) - axis - len(covered))

        def step(v: Values) -> None:
            v[bottom] = v[bottom] * gamma.reshape(covered + trailing) + (beta.reshape(covered + trailing) if bias
                                                                          else 0)
        params = f"scale_param {{ axis: {axis} num_axes: {num_axes} bias_term: {str(bias).lower()} }}"
        return self.layer("Scale", [bottom], [bottom], params, [gamma, beta] if bias else [gamma], step)

    def prelu(self, bottom: str, shared: bool = False) -> str:
        c = self.shape(bottom)[1]
        slope = self.rng.uniform(0.05, 0.5, 1 if shared else c).astype(np.float32)
        top = f"prelu{self.count + 1}"

        def step(v: Values) -> None:
            x = v[bottom]
            a = slope.reshape((1, -1) + (1,) * (x.ndim - 2)) if not shared else slope[0]
            v[top] = np.where(x > 0, x, x * a)
        return self.layer("PReLU", [bottom], [top], f"prelu_param {{ channel_shared: {str(shared).lower()} }}",
                          [slope], step)

    # ---- layers without weights

    def relu(self, bottom: str, slope: float = 0.0, in_place: bool = True) -> str:
        top = bottom if in_place else f"relu{self.count + 1}"

        def step(v: Values) -> None:
            v[top] = np.where(v[bottom] > 0, v[bottom], v[bottom] * np.float32(slope))
        return self.layer("ReLU", [bottom], [top], f"relu_param {{ negative_slope: {slope} }}" if slope else "",
                          step=step)

    def unary(self, type_: str, bottom: str, fn: Callable[[np.ndarray], np.ndarray], params: str = "") -> str:
        top = f"{type_.lower()}{self.count + 1}"

        def step(v: Values) -> None:
            v[top] = fn(v[bottom])
        return self.layer(type_, [bottom], [top], params, step=step)

    def pool(self, bottom: str, method: str = "MAX", k: int = 2, stride: int = 2, pad: int = 0,
             global_: bool = False, floor: bool = False, top: str | None = None) -> str:
        top = top or f"pool{self.count + 1}"
        if global_:
            params = f"pooling_param {{ pool: {method} global_pooling: true }}"

            def step(v: Values) -> None:
                x = v[bottom]
                v[top] = (x.max(axis=(2, 3), keepdims=True) if method == "MAX" else x.mean(axis=(2, 3), keepdims=True))
        else:
            params = (f"pooling_param {{ pool: {method} kernel_size: {k} stride: {stride} pad: {pad}"
                      f"{' round_mode: FLOOR' if floor else ''} }}")

            def step(v: Values) -> None:
                v[top] = pool2d(v[bottom], method, (k, k), (stride, stride), (pad, pad), ceil=not floor)
        return self.layer("Pooling", [bottom], [top], params, step=step)

    def eltwise(self, bottoms: Sequence[str], op: str = "SUM", coeff: Sequence[float] = ()) -> str:
        top = f"eltwise{self.count + 1}"
        params = f"eltwise_param {{ operation: {op} " + " ".join(f"coeff: {c}" for c in coeff) + " }"

        def step(v: Values) -> None:
            xs = [v[b] for b in bottoms]
            if op == "SUM":
                v[top] = sum(x * c for x, c in zip(xs, coeff or [1.0] * len(xs), strict=True))
            elif op == "PROD":
                v[top] = np.prod(xs, axis=0)
            else:
                v[top] = np.max(xs, axis=0)
        return self.layer("Eltwise", list(bottoms), [top], params, step=step)

    def softmax(self, bottom: str, axis: int = 1) -> str:
        top = f"prob{self.count + 1}"

        def step(v: Values) -> None:
            v[top] = softmax(v[bottom], axis)
        return self.layer("Softmax", [bottom], [top], f"softmax_param {{ axis: {axis} }}", step=step)


# ---------------------------------------------------------------- whole networks


def _conv_bn(n: CaffeNet, bottom: str, cout: int, k: int, stride: int = 1, group: int = 1, relu: bool = True) -> str:
    top = n.conv(bottom, cout, k, stride=stride, pad=k // 2, group=group, bias=False)
    n.batch_norm(top)
    n.scale(top)
    return n.relu(top) if relu else top


def mobilenet_like(size: int = 16) -> CaffeNet:
    """Depthwise + pointwise convolutions with BatchNorm + Scale + ReLU, global pooling,
    InnerProduct and Softmax: the MobileNet v1 pattern."""
    n = CaffeNet("mobilenet_like", seed=30)
    x = _conv_bn(n, n.input("data", [1, 3, size, size]), 8, 3, stride=2)
    for cout, stride in ((16, 1), (24, 2)):
        channels = n.shape(x)[1]
        x = _conv_bn(n, x, channels, 3, stride=stride, group=channels)  # depthwise
        x = _conv_bn(n, x, cout, 1)  # pointwise
    x = n.pool(x, "AVE", global_=True)
    n.softmax(n.inner_product(x, 10))
    return n


def resnet_like(size: int = 16) -> CaffeNet:
    """Residual blocks (Eltwise SUM, identity and projection shortcuts) and pooling whose
    output size Caffe rounds up."""
    n = CaffeNet("resnet_like", seed=31)
    x = _conv_bn(n, n.input("data", [1, 3, size, size]), 8, 3)
    x = n.pool(x, "MAX", 3, 2)  # 16 -> 8 (7 when rounded down)
    for cout, stride in ((8, 1), (16, 2)):
        y = _conv_bn(n, x, cout, 3, stride=stride)
        y = _conv_bn(n, y, cout, 3, relu=False)
        shortcut = x if stride == 1 else _conv_bn(n, x, cout, 1, stride=stride, relu=False)
        x = n.relu(n.eltwise([y, shortcut]))
    x = n.pool(x, "AVE", 3, 2)  # 4 -> 2 (1 when rounded down)
    n.softmax(n.inner_product(x, 10))
    return n
