"""Scripts written for newer toolkit releases import the debugger from ``horizon_nn.quantizer.debugger``
or ``hmct.quantizer.debugger``; both are the same functions as ``horizon_nn.debug`` (seed 000)."""

from __future__ import annotations

import importlib

import pytest

import hbtools.debug


@pytest.mark.parametrize("module_name",
                         ["horizon_nn.debug", "horizon_nn.quantizer.debugger", "hmct.quantizer.debugger"])
def test_every_vendor_import_path_reaches_the_debugger(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for function_name in hbtools.debug.__all__:
        assert getattr(module, function_name) is getattr(hbtools.debug, function_name)
