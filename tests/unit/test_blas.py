"""numpy's matrix products on one BLAS thread: the same numbers, and the thread count given back."""

from __future__ import annotations

import numpy as np
import pytest

from hbtools.runtime import blas


def test_one_thread_inside_the_block_the_same_products_and_the_count_restored() -> None:
    if blas._CALLS is None:
        pytest.skip("numpy's BLAS here is not a bundled OpenBLAS with a thread call")
    get, put = blas._CALLS
    before = get()
    cols = np.random.default_rng(0).standard_normal((64, 25, 3000))
    want = np.matmul(cols, cols.transpose(0, 2, 1))
    with blas.one_blas_thread():
        assert get() == 1
        got = np.matmul(cols, cols.transpose(0, 2, 1))
    assert get() == before
    np.testing.assert_array_equal(got, want)  # threads split the output, not the sums
    with pytest.raises(ValueError), blas.one_blas_thread():
        raise ValueError("restored on the way out too")
    assert get() == before


def test_overlapping_blocks_in_threads_keep_one_thread_until_the_last_leaves() -> None:
    """hrt_model_exec perf runs the simulator on several threads: the first block out must not give
    the other workers their BLAS threads back, and the last must."""
    if blas._CALLS is None:
        pytest.skip("numpy's BLAS here is not a bundled OpenBLAS with a thread call")
    import threading

    get, put = blas._CALLS
    put(2)
    inside, release = threading.Event(), threading.Event()
    seen = []

    def slow() -> None:
        with blas.one_blas_thread():
            inside.set()
            release.wait(10)
            seen.append(get())

    other = threading.Thread(target=slow)
    with blas.one_blas_thread():  # the first in, and the first out
        other.start()
        assert inside.wait(10)
    seen.append(get())  # the other block is still open
    release.set()
    other.join()
    assert seen == [1, 1]
    assert get() == 2
