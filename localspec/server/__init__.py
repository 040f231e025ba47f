"""The OpenAI-compatible HTTP server behind ``localspec serve`` (see docs/server.md)."""

from __future__ import annotations

from localspec.server.app import create_app

__all__ = ["create_app"]
