"""Compatibility package: the newest toolkit names the debugger's package ``hmct`` (its CLI is ``hmct-debugger``)."""
