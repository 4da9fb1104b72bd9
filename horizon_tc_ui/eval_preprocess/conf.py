"""``MODEL_DICT``: each vendor sample model's entry, ``{"read_mode": "skimage" | "opencv", "enable": True}``."""

from hbtools.data.eval_preprocess import RECIPES

MODEL_DICT: dict[str, dict[str, object]] = {
    name: {"read_mode": r.read, "enable": True} for name, r in RECIPES.items() if r.vendor_size is not None
}

__all__ = ["MODEL_DICT"]
