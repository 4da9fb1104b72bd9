"""Compatibility package: ``horizon_tc_ui.utils.tool_utils`` for the toolkit's sample scripts."""
