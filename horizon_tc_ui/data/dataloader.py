"""Compatibility import: ``from horizon_tc_ui.data.dataloader import SingleImageDataLoader``."""

from hbtools.data.loaders import ImageNetDataLoader, SingleImageDataLoader, SingleImageDataLoaderWithOrigin

__all__ = ["ImageNetDataLoader", "SingleImageDataLoader", "SingleImageDataLoaderWithOrigin"]
