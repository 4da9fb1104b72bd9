"""``<model>_data_transformer()`` for each vendor sample model: its transformers (after the picture is
read as ``conf.MODEL_DICT`` says) and its input size (height, width), as the vendor's scripts call them."""

from __future__ import annotations

from collections.abc import Callable

from hbtools.data.eval_preprocess import RECIPES, Recipe


def _function(recipe: Recipe, name: str) -> Callable[[], tuple[list, tuple[int, int]]]:
    def data_transformer() -> tuple[list, tuple[int, int]]:
        return recipe.steps(), recipe.vendor_size  # type: ignore[return-value]

    data_transformer.__name__ = data_transformer.__qualname__ = f"{name}_data_transformer"
    data_transformer.__module__ = __name__  # the vendor's script lists this module's own functions
    return data_transformer


for _name, _recipe in RECIPES.items():
    if _recipe.vendor_size is not None:
        globals()[f"{_name}_data_transformer"] = _function(_recipe, _name)
# the vendor's own names for functions shared by several models
for _alias, _name in (("mobilenet", "mobilenetv1"), ("deeplabv3plus_efficientnet", "deeplabv3plus_efficientnetm1"),
                      ("fcos_efficientnetb1", "preq_qat_fcos_efficientnetb1"),
                      ("fcos_efficientnetb2", "preq_qat_fcos_efficientnetb2"),
                      ("fcos_efficientnetb3", "preq_qat_fcos_efficientnetb3")):
    globals()[f"{_alias}_data_transformer"] = _function(RECIPES[_name], _alias)

# model name -> (transformers, (height, width)), as the vendor's module holds it
data_transformer_info: dict[str, tuple[list, tuple[int, int]]] = {
    _name: globals()[f"{_name}_data_transformer"]() for _name, _recipe in RECIPES.items()
    if _recipe.vendor_size is not None}


def get_data_transformer_info(model_name: str) -> tuple[list, tuple[int, int]]:
    """The older form: ``(transformers, (height, width))`` of ``model_name``."""
    function = globals().get(f"{model_name}_data_transformer")
    if function is None:
        raise ValueError(f"model name {model_name!r} is not a vendor sample model; hb_eval_preprocess --help "
                         "lists them")
    return function()
