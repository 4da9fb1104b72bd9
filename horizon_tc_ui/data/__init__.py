"""Compatibility package: ``horizon_tc_ui.data.transformer`` is ``hbtools.data.transforms``."""
