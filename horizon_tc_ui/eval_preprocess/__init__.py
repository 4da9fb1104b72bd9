"""Compatibility package: the vendor's ``horizon_tc_ui.eval_preprocess`` modules, over
``hbtools.data.eval_preprocess`` (the vendor sample models' preprocessing)."""
