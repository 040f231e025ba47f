"""User-facing errors: each carries one sentence saying what is wrong and what to do.

The CLI prints ``str(error)`` and exits with code 2; the server maps them to OpenAI-style error
JSON. Anything that is not a LocalspecError is a bug and keeps its traceback.
"""

from __future__ import annotations


class LocalspecError(Exception):
    """Base class for mistakes a user can fix (bad file, bad parameter, ...)."""

    status_code = 400  # HTTP status when raised inside the server


class ModelLoadError(LocalspecError):
    """A model file is missing, not GGUF, truncated, or llama.cpp refused it."""


class VocabMismatchError(LocalspecError):
    """Draft and target do not share a vocabulary."""


class PromptTooLongError(LocalspecError):
    """The prompt does not fit into the context. ``param``: the request field that holds it
    (the server's error names it: "prompt", or "messages" for a chat)."""

    def __init__(self, message: str, param: str = "prompt") -> None:
        super().__init__(message)
        self.param = param


class InvalidParameterError(LocalspecError, ValueError):
    """A generation or load parameter is out of range (a ValueError too, so that pydantic
    validators and text parsers can raise it as it is). ``param``: the request field at fault,
    when the message does not start with ``name=value`` (the server's error names it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineClosedError(LocalspecError):
    """A request was submitted to an engine that has been closed."""

    status_code = 503


class QueueFullError(LocalspecError):
    """Too many requests are waiting for the engine."""

    status_code = 429


class RemoteWorkerError(LocalspecError):
    """An RPC worker (``--rpc``) cannot be reached, is busy, speaks another protocol version, or
    dropped its connection."""

    status_code = 503


class GenerationFailedError(LocalspecError):
    """The core ended one generation on a failure of its own (not the request's); the others
    in its batch went on. Reported as a server error, without the request's data."""

    status_code = 500


class RpcUnavailableError(LocalspecError):
    """The installed llama-cpp-python build has no RPC backend."""

    status_code = 501
