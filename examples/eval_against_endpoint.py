"""Evaluate a trained DoND checkpoint against an OpenAI-compatible endpoint (and against itself and a held-out bot).

    python examples/eval_against_endpoint.py --checkpoint runs/demo/ibrl/agent1/hf \
        --endpoint 'glm-5@http://10.0.0.5:8000/v1#GLM_API_KEY' -n 200 --out runs/demo/eval_vs_glm

The endpoint is any ``/chat/completions`` server (vLLM, SGLang, a hosted API); its key is read from the named
environment variable (``#GLM_API_KEY``), never passed as a value. The checkpoint runs on the same rollout engines as
training. Every scenario is played with the checkpoint in both seats; episodes stream to ``OUT/episodes/`` (a rerun
resumes) and ``OUT/tables.md`` holds agreement / own utility / joint value per counterpart. Extra flags after
``--`` go to ``marti-ibrl eval`` (e.g. ``-- --prompt-style compact --max-rounds 5``). ``tests/eval/test_eval_cli.py``
runs this example's command against a local endpoint.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def eval_argv(
    checkpoint: str, endpoint: str, out: str, n: int = 200, name: str = "policy", extra: Sequence[str] = ()
) -> list[str]:
    """The ``marti-ibrl eval`` command line: ``name`` vs the endpoint ``MODEL@BASE_URL[#KEY_ENV]``, itself and the
    held-out hardliner bot."""
    return [
        *("eval", "--policy", f"{name}={checkpoint}", "--counterpart", "heldout:hardliner"),
        *("--counterpart", f"ep=endpoint:{endpoint}", "--self-play", "-n", str(n)),
        *extra,
        *("--out", str(out)),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    from marti_ibrl.cli import main as cli_main

    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="HF checkpoint directory (e.g. RUN/agent1/hf)")
    parser.add_argument("--endpoint", required=True, help="MODEL@BASE_URL[#API_KEY_ENV]")
    parser.add_argument("--out", required=True)
    parser.add_argument("-n", type=int, default=200, help="held-out scenarios (default 200)")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    return cli_main(eval_argv(args.checkpoint, args.endpoint, args.out, args.n, extra=extra))


if __name__ == "__main__":
    sys.exit(main())
