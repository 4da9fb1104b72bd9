"""Compatibility import: ``from horizon_tc_ui.eval_preprocess.dataloader import SingleImageDataLoader``."""

from hbtools.data.loaders import SingleImageDataLoader

__all__ = ["SingleImageDataLoader"]
