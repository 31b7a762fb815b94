"""Is this directory a model that loads? One check for every command that takes a checkpoint (``train
--roleN.pretrain`` and ``--roleN.frozen checkpoint:``, ``eval --policy`` / ``--in-system`` / ``--counterpart
checkpoint:``, ``play --policy``), made before any process starts, so a broken checkpoint is one line naming the file
instead of a Ray ``ActorDiedError`` or a ``SafetensorError`` from inside an engine.

A Hugging Face model directory (``config.json``, a JSON object, and its weights: ``model.safetensors``, the shards a
``*.index.json`` lists, or ``pytorch_model.bin``) or a peft adapter (``adapter_config.json`` and
``adapter_model.safetensors``/``.bin``). A safetensors file is read as far as its header (8 bytes of length, then
JSON): a file shorter than the tensors its header describes is truncated. Reading headers costs milliseconds, not
the weights.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"


def _json_object(file: Path) -> str | None:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        return f"{file} is not JSON ({type(e).__name__}: {str(e)[:80]})"
    return None if isinstance(data, dict) else f"{file} is not a JSON object (a {type(data).__name__})"


def _count(x: object) -> bool:
    """A byte offset: a non-negative int (a JSON ``true`` is not one)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def safetensors_problem(file: Path) -> str | None:
    """Why ``file`` is not a whole safetensors file (None: its header parses and the file holds every tensor)."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{file} is truncated ({size} bytes: not even a safetensors header)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{file} is truncated ({size} bytes; its header alone claims {n})"
            header = json.loads(f.read(n))
    except OSError as e:
        return f"{file} cannot be read ({e.strerror or e})"
    except (ValueError, UnicodeDecodeError, RecursionError):
        return f"{file} is not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return f"{file} is not a safetensors file (its header is not a JSON object)"
    ends = []
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(x) for x in offsets)):
            shown = " ".join(json.dumps(offsets)[:40].split())
            return f"{file} is not a safetensors file (tensor {name[:40]!r} has data_offsets {shown})"
        ends.append(offsets[1])
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"{file} is truncated ({size} bytes of the {need} its header describes)"
    return None


def _weights(path: Path, names: tuple[str, ...]) -> list[Path] | str:
    """The weight files of ``path``: the first of ``names`` present, or the shards its index lists."""
    for name in names:
        file = path / name
        if name.endswith(".index.json") and file.is_file():
            if why := _json_object(file):
                return why
            weight_map = json.loads(file.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                return f"{file} has no weight_map"
            if not weight_map:
                return f"{file} lists no weights"
            return [path / shard for shard in sorted(set(map(str, weight_map.values())))]
        if file.is_file():
            return [file]
    return f"{path} holds no weights ({', '.join(names)})"


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a loadable model or peft adapter directory, in words naming the file; None when it is."""
    path = Path(path)
    if not path.is_dir():
        return f"{path} is not a model ({'a file, not a directory' if path.exists() else 'no such directory'})"
    if (path / ADAPTER_CONFIG).is_file():
        config = path / ADAPTER_CONFIG
        names: tuple[str, ...] = ("adapter_model.safetensors", "adapter_model.bin")
    else:
        config = path / "config.json"
        if not config.is_file():
            return f"{path} is not a model (no config.json or {ADAPTER_CONFIG} there)"
        names = (
            "model.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "pytorch_model.bin.index.json",
        )
    if why := _json_object(config):
        return why
    files = _weights(path, names)
    if isinstance(files, str):
        return files
    for file in files:
        if not file.is_file():
            return f"{file} is missing (its index lists it)"
        if file.suffix == ".safetensors" and (why := safetensors_problem(file)):
            return why
        if file.suffix == ".bin" and file.stat().st_size == 0:
            return f"{file} is empty"
    return None
