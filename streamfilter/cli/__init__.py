"""Every ``streamfilter`` command (``main`` builds the parser; one module per command)."""

from streamfilter.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
