"""`localspec convert-head`: a Hugging Face EAGLE-3 checkpoint -> the eagle3 GGUF llama.cpp
loads (localspec/heads/convert.py; numpy and the gguf package, no torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from localspec.errors import InvalidParameterError
from localspec.files import check_output_path
from localspec.heads.convert import OUTTYPES, convert_head
from localspec.runtime.loading import check_model_path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "convert-head",
        help="convert an EAGLE-3 head (safetensors + config.json) to GGUF",
        description="Write OUT, the eagle3 GGUF of the EAGLE-3 checkpoint in CHECKPOINT (EAGLE's "
        "midlayer.* or the speculators layers.0.* layout), for the target model TARGET, whose "
        "tokenizer and shape it takes. Same file as llama.cpp's convert_hf_to_gguf.py.",
    )
    parser.add_argument("checkpoint", help="directory with config.json and model*.safetensors")
    parser.add_argument("--target", required=True,
                        help="the target GGUF the head was trained for (required; a path or "
                        "models.toml "
                        "name)")
    parser.add_argument("-o", "--output", required=True, help="the GGUF to write (required)")
    parser.add_argument("--outtype", choices=OUTTYPES, default="auto",
                        help="weight type; auto: the checkpoint's 16-bit type, else f16 (default: "
                        "%(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.models import registry

    checkpoint, out = Path(args.checkpoint), Path(args.output)
    if not checkpoint.is_dir():
        raise InvalidParameterError(
            f"'{checkpoint}' is not a directory; pass the folder holding the head's config.json "
            "and model.safetensors."
        )
    target = str(registry.resolve_model(args.target))
    check_model_path(target, "target")
    inputs: list[str | Path] = [target, *(p for p in checkpoint.iterdir() if p.is_file())]
    check_output_path(out, "--output", inputs)
    try:
        convert_head(checkpoint, target, out, args.outtype)
    except OSError as error:  # the output could not be written (a full disk, a lost mount)
        out.unlink(missing_ok=True)
        raise InvalidParameterError(
            f"--output: could not write '{out}' ({error.strerror or error}); free space or "
            "write elsewhere.") from None
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0
