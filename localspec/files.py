"""The user's files, opened one way: inputs must be readable regular files, outputs must be
new or regular files that are none of the inputs.

A FIFO, a device or a directory given where a file belongs would block a read forever or fail
deep inside a library; an output that names an input would overwrite the user's model. Each
case is one sentence naming the option (InvalidParameterError: exit code 2 on the CLI).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from localspec.errors import InvalidParameterError

TEXT_LIMIT = 64 * 1024 * 1024  # a grammar, schema, template or prompt file larger is a mistake


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def _open_regular(name: str, option: str) -> tuple[int, os.stat_result]:
    """A descriptor of a regular file, opened without blocking (a FIFO is refused, not waited
    on) and checked after opening (nothing swaps it in between)."""
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise InvalidParameterError(
            f"{option}: cannot read '{name}' ({error.strerror}); give a readable file.") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InvalidParameterError(
            f"{option}: '{name}' is not a regular file ({_kind(info.st_mode)}); give a "
            "regular file.")
    return fd, info


def check_input_file(path: str | os.PathLike[str], option: str) -> None:
    """That ``path`` is a readable regular file, before any work depends on it."""
    fd, _ = _open_regular(os.fspath(path), option)
    os.close(fd)


def read_input_bytes(path: str | os.PathLike[str], option: str, limit: int = TEXT_LIMIT) -> bytes:
    """The whole content of a regular file (``_open_regular``), at most ``limit`` bytes."""
    name = os.fspath(path)
    fd, info = _open_regular(name, option)
    if info.st_size > limit:
        os.close(fd)
        raise InvalidParameterError(
            f"{option}: '{name}' is {info.st_size} bytes, more than {limit}; give a smaller "
            "file.")
    with os.fdopen(fd, "rb") as handle:
        try:
            return handle.read(limit + 1)[:limit]
        except OSError as error:
            raise InvalidParameterError(
                f"{option}: cannot read '{name}' ({error.strerror}).") from None


def read_input_text(path: str | os.PathLike[str], option: str, limit: int = TEXT_LIMIT) -> str:
    """``read_input_bytes`` as UTF-8 text."""
    try:
        return read_input_bytes(path, option, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameterError(
            f"{option}: '{os.fspath(path)}' is not UTF-8 text.") from None


def check_output_path(path: str | os.PathLike[str], option: str,
                      inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """An output path that can be written: in an existing directory, new or a regular file,
    and not one of ``inputs`` (the same file by any name)."""
    out = Path(path)
    if not out.parent.is_dir():
        raise InvalidParameterError(f"{option}: the directory '{out.parent}' does not exist.")
    try:
        info = os.stat(out)
    except FileNotFoundError:
        return out
    except OSError as error:
        raise InvalidParameterError(f"{option}: cannot use '{out}' ({error.strerror}).") from None
    if not stat.S_ISREG(info.st_mode):
        raise InvalidParameterError(
            f"{option}: '{out}' is not a regular file ({_kind(info.st_mode)}); name a file to "
            "write.")
    for source in inputs:
        try:
            same = os.path.samefile(out, source)
        except OSError:
            same = False
        if same:
            raise InvalidParameterError(
                f"{option}: '{out}' is the input '{os.fspath(source)}'; write to a different "
                "file (it would be overwritten).")
    return out
