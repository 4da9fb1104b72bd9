"""The similarity metrics give the same value whatever the machine's core count.

They run between onnxruntime runs in the debugger's sweeps and makertbin's searches. A BLAS dot
product is split over OpenBLAS's threads, so its sum (and the debugger's table) depended on how
many threads OpenBLAS started, and those threads then spun against onnxruntime's.
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import numpy as np
from hbtools.metrics import CosineTo, cosine_similarity, products
rng = np.random.default_rng(7)
a = rng.standard_normal(300_000).astype(np.float32)
b = a + 0.01 * rng.standard_normal(a.size).astype(np.float32)
print(repr(cosine_similarity(a, b)), repr(CosineTo(a)(b)), *map(repr, products(a, b)))
"""


def _values(blas_threads: int) -> str:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(blas_threads), "OMP_NUM_THREADS": str(blas_threads)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_cosine_does_not_depend_on_the_blas_thread_count() -> None:
    one, four = _values(1), _values(4)
    assert one == four
    cosine, cosine_to = one.split()[:2]
    assert cosine == cosine_to  # the debugger's prepared form sums the same products in the same order
