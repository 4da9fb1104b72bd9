"""Compatibility package: the vendor import paths, re-exported from hbtools."""
