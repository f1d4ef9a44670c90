"""The ``episodelake`` command (``main``) and its demo.

May import: every folder and the façade.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
