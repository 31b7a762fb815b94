#!/usr/bin/env bash
# Embedded CPU default (`make demo`): build a tiny Qwen-architecture model + tokenizer locally,
# SFT warm-start it with OpenRLHF's SFT trainer on scripted DoND negotiator dialogues, then run
# IB-RL on DoND through the local Ray + DeepSpeed path (config: recipes/dond/tiny-cpu.yaml).
# Extra arguments go to `marti-ibrl demo` (e.g. --out DIR, --iterations N).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/marti-ibrl demo --config recipes/dond/tiny-cpu.yaml "$@"
