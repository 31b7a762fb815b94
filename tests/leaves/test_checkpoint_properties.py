"""Issue 63: checkpoints, property-based. Hypothesis builds model and adapter directories as a crash, a copy or an edit
may leave them (config or adapter config gone, of another JSON type, cut or bytes; the weights cut anywhere, their
header's length field or JSON replaced, tensors with offsets of any type; an index whose weight map lists missing or
odd shards) and ``checkpoint_problem`` must answer each with None or one line naming a file of the directory, never an
exception; None only where the weights are whole. What every command checks a checkpoint with before loading it
(``train``'s roles, ``eval --policy``, ``diagnose``, ``export-merged``, ``play``)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marti_ibrl.checkpoints import checkpoint_problem

EXAMPLES = int(os.environ.get("MARTI_CLI_EXAMPLES", "1000"))
CASES = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _safetensors(header: object, data: bytes, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


@st.composite
def weights(draw) -> tuple[bytes, bool]:
    """A model.safetensors as bytes, and whether it is whole (holds every tensor its header describes)."""
    data = bytes(range(16)) * 4  # 64 bytes: two float32 tensors of 8
    header = {"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
              "b": {"dtype": "F32", "shape": [8], "data_offsets": [32, 64]}}  # fmt: skip
    kind = draw(st.sampled_from(["whole"] * 3 + ["cut", "length", "header", "offsets", "bytes", "empty"]))
    if kind == "whole":
        return _safetensors(header, data), True
    if kind == "cut":
        whole = _safetensors(header, data)
        return whole[: draw(st.integers(0, len(whole) - 1))], False
    if kind == "length":  # the 8-byte length field says something else
        raw = len(json.dumps(header))
        length = draw(st.integers(0, 2**64 - 1).filter(lambda n: n != raw))
        return _safetensors(header, data, length), False
    if kind == "header":  # any JSON where the header is
        return _safetensors(draw(JSON_VALUES), data), None  # whole or not: the answer may be either
    if kind == "offsets":  # a tensor whose offsets are of any type
        header["b"]["data_offsets"] = draw(JSON_VALUES)
        return _safetensors(header, data), None
    if kind == "bytes":
        return draw(st.binary(max_size=200)), None
    return b"", False


@st.composite
def checkpoint(draw) -> dict:
    """The files of a model or adapter directory (name -> bytes, None: absent), and whether its weights are whole."""
    blob, whole = draw(weights())
    adapter = draw(st.booleans())
    config = "adapter_config.json" if adapter else "config.json"
    files = {config: b'{"model_type": "qwen2"}'}
    kind = draw(st.sampled_from(["fine"] * 3 + ["gone", "json", "cut", "bytes"]))
    if kind == "gone":
        files[config] = None
    elif kind == "json":
        files[config] = json.dumps(draw(JSON_VALUES)).encode()
    elif kind == "cut":
        files[config] = files[config][: draw(st.integers(0, len(files[config]) - 1))]
    elif kind == "bytes":
        files[config] = draw(st.binary(max_size=60))
    weight = "adapter_model.safetensors" if adapter else "model.safetensors"
    if not adapter and draw(st.booleans()):  # sharded: an index and its shards
        shard_map = draw(st.one_of(
            st.just({"a": "model-1.safetensors", "b": "model-1.safetensors"}),
            st.just({"a": "model-1.safetensors", "b": "model-2.safetensors"}),  # one shard missing
            JSON_VALUES,
        ))  # fmt: skip
        files["model.safetensors.index.json"] = json.dumps({"weight_map": shard_map}).encode()
        files["model-1.safetensors"] = blob
        listed = isinstance(shard_map, dict) and set(map(str, shard_map.values())) == {"model-1.safetensors"}
        whole = whole if listed else False  # a shard missing, none listed, or no weight map: never whole
    elif draw(st.integers(0, 9)):  # mostly present
        files[weight] = blob
    else:
        whole = False
    config_ok = files[config] is not None and _is_object(files[config])
    return {"files": files, "whole": whole, "config_ok": config_ok}


def _is_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw.decode("utf-8")), dict)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False


def test_any_checkpoint_directory_is_answered_in_one_line() -> None:
    seen = Counter()
    root = Path(tempfile.mkdtemp(prefix="ckpt_props_"))

    @CASES
    @given(case=checkpoint())
    def case(case):
        path = root / "ckpt"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        for name, raw in case["files"].items():
            if raw is not None:
                (path / name).write_bytes(raw)
        why = checkpoint_problem(path)  # never raises
        if why is None:
            assert case["config_ok"] and case["whole"] is not False, case
            seen["loadable"] += 1
        else:
            assert isinstance(why, str) and "\n" not in why and str(path) in why, (why, case)
            assert case["whole"] is not True or not case["config_ok"] or "index" in why or "weight_map" in why, (
                why,
                case,
            )
            seen["refused"] += 1

    try:
        case()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(dict(seen))
    assert sum(seen.values()) >= min(EXAMPLES, 1000) and seen["loadable"] > 0 and seen["refused"] > 0, seen


@pytest.mark.parametrize("offsets", [5, [1], ["0", "8"], [0, None], {"a": 1}, [0, 2**80]])
def test_a_tensor_with_odd_offsets_is_named_not_raised(tmp_path, offsets) -> None:
    """Found by the property above: a header whose offsets are not two integers raised TypeError/IndexError."""
    header = {"a": {"dtype": "F32", "shape": [8], "data_offsets": offsets}}
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(_safetensors(header, bytes(32)))
    why = checkpoint_problem(tmp_path)
    assert why is not None and why.startswith(str(tmp_path / "model.safetensors")), why


def test_an_index_that_lists_no_weights_is_named(tmp_path) -> None:
    """Found by the property above: ``{"weight_map": {}}`` passed for a loadable model with no weights at all."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    assert checkpoint_problem(tmp_path) == f"{tmp_path / 'model.safetensors.index.json'} lists no weights"
