#!/usr/bin/env bash
# Run a long, resumable benchmark on a machine that CI (or a developer's `.ci/run`) also uses, and give way to it.
#
#   setsid nohup benchmarks/yield_to_ci.sh .venv/bin/python benchmarks/mini_table2.py --out runs/mini_table2 \
#       > runs/bench.log 2>&1 &
#
# While no `.ci/run` runs on the machine, COMMAND runs in its own process group. When one starts, COMMAND is
# interrupted (SIGINT, then SIGTERM after 60 s, then SIGKILL), every process it left (Ray workers outlive their
# driver; they are found by a variable in their environment, inherited from COMMAND) is killed, and COMMAND is started again once the machine has had no `.ci/run`
# for a minute. COMMAND must therefore resume from its own committed work (mini_table2 does: finished runs are
# skipped, a run resumes from its last committed iteration). A 2-core / 24 GiB machine cannot hold a benchmark
# run (≈ 9 GB) beside the test suite's Slurm cluster (≈ 15 GB): Ray's memory monitor kills one of them.
#
# Plain bash rather than a Python supervisor: it has to outlive and kill Python process trees, and needs only ps.
set -u
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
export YIELD_TO_CI_TOKEN="yield-$$-$(date +%s)"  # inherited by COMMAND and everything it starts
POLL=${YIELD_POLL_S:-20}

ci_running() {  # a `.ci/run` (bash .ci/run, or its make/pytest children named so) anywhere on the machine
  pgrep -f '(^|/| )\.ci/run( |$)' > /dev/null
}

kill_leftovers() {  # every process but this one whose environment carries the token
  local pid
  for pid in $(grep -lsz "^YIELD_TO_CI_TOKEN=$YIELD_TO_CI_TOKEN\$" /proc/[0-9]*/environ | cut -d/ -f3); do
    [ "$pid" = $$ ] || kill -9 "$pid" 2> /dev/null
  done
}

stamp() { date -u +%FT%TZ; }
trap 'echo "$(stamp) yield_to_ci: stopped"; [ -n "${child:-}" ] && kill -INT -- "-$child" 2> /dev/null; exit 130' INT TERM

while :; do
  quiet=0
  while [ $quiet -lt 60 ]; do  # a minute with no CI before (re)starting: make's pytest starts after the install
    if ci_running; then quiet=0; else quiet=$((quiet + POLL)); fi
    sleep "$POLL"
  done
  echo "$(stamp) yield_to_ci: starting: $*"
  setsid "$@" &
  child=$!
  while kill -0 "$child" 2> /dev/null; do
    if ci_running; then
      echo "$(stamp) yield_to_ci: a .ci/run started: interrupting (the command resumes afterwards)"
      kill -INT -- "-$child" 2> /dev/null
      for _ in $(seq 60); do kill -0 "$child" 2> /dev/null || break; sleep 1; done
      kill -TERM -- "-$child" 2> /dev/null; sleep 5; kill -KILL -- "-$child" 2> /dev/null
      wait "$child" 2> /dev/null
      kill_leftovers
      continue 2
    fi
    sleep "$POLL"
  done
  wait "$child"; rc=$?
  child=
  kill_leftovers
  echo "$(stamp) yield_to_ci: the command ended with status $rc"
  exit "$rc"
done
