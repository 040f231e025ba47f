"""The OpenAI-compatible HTTP server behind ``localspec serve`` (see docs/server.md)."""

from __future__ import annotations

from localspec.server.app import create_app
from localspec.server.options import ServerOptions

__all__ = ["ServerOptions", "create_app"]
