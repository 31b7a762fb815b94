#!/usr/bin/env bash
# Run a long, resumable benchmark on a machine that CI (or a developer's tests) also uses, and give way to it.
#
#   setsid nohup benchmarks/yield_to_ci.sh .venv/bin/python benchmarks/mini_table2.py --out runs/mini_table2 \
#       > runs/bench.log 2>&1 &
#
# While no `.ci/run` or pytest runs on the machine, COMMAND runs in its own process group. When one starts,
# COMMAND is stopped (SIGTERM, then SIGKILL after 30 s: a job started in the background ignores SIGINT), every
# process it left is killed (Ray workers outlive their driver; they are found by a variable in their environment,
# inherited from COMMAND), and COMMAND is started again once the machine has had neither for a minute. COMMAND
# must therefore resume from its own committed work (mini_table2 does: kept units are skipped, a run resumes
# from its last committed iteration). A 2-core / 24 GiB machine cannot hold a benchmark run (≈ 9 GB) beside the
# test suite's Slurm cluster (≈ 15 GB): Ray's memory monitor kills one of them.
#
# It also gives way while the file YIELD_HOLD (default /tmp/yield_to_ci.hold) exists: `touch` it before running
# something heavy by hand, remove it afterwards. YIELD_ON (an extended regex for `pgrep -f`) replaces what counts as
# CI: e.g. YIELD_ON='(^|/| )\.ci/run( |$)|make test' while several developers run single test modules beside it
# (light, and each would otherwise interrupt a training unit).
#
# Plain bash rather than a Python supervisor: it has to outlive and kill Python process trees, and needs only ps.
# It runs from a copy of itself, so that a `git pull` in the clone cannot change the script under a running bash.
set -u
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
if [ -z "${YIELD_TO_CI_COPY:-}" ]; then
  copy=$(mktemp /tmp/yield_to_ci.XXXXXX.sh) && cp "$0" "$copy" || exit 2
  YIELD_TO_CI_COPY=$copy exec bash "$copy" "$@"
fi
rm -f "$YIELD_TO_CI_COPY"  # (bash keeps reading the open file)
HOLD=${YIELD_HOLD:-/tmp/yield_to_ci.hold}
YIELD_ON=${YIELD_ON:-'(^|/| )\.ci/run( |$)|(-m |/|^)pytest( |$)'}
export YIELD_TO_CI_TOKEN="yield-$$-$(date +%s)"  # inherited by COMMAND and everything it starts
POLL=${YIELD_POLL_S:-20}

ci_running() {  # a `.ci/run` or a pytest anywhere on the machine (CI's, or a developer's), or the hold file
  [ -e "$HOLD" ] || pgrep -f "$YIELD_ON" > /dev/null
}

kill_leftovers() {  # every process but this one whose environment carries the token
  local pid
  for pid in $(grep -lsz "^YIELD_TO_CI_TOKEN=$YIELD_TO_CI_TOKEN\$" /proc/[0-9]*/environ | cut -d/ -f3); do
    [ "$pid" = $$ ] || kill -9 "$pid" 2> /dev/null
  done
}

stamp() { date -u +%FT%TZ; }
stop_child() {  # COMMAND's process group, then whatever it left
  if [ -n "${child:-}" ]; then
    kill -TERM -- "-$child" 2> /dev/null
    for _ in $(seq 30); do kill -0 "$child" 2> /dev/null || break; sleep 1; done
    kill -KILL -- "-$child" 2> /dev/null
    wait "$child" 2> /dev/null
  fi
  child=
  kill_leftovers
}
trap 'echo "$(stamp) yield_to_ci: stopped"; stop_child; exit 143' TERM INT

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
      echo "$(stamp) yield_to_ci: a .ci/run (or $HOLD) appeared: interrupting (the command resumes afterwards)"
      stop_child
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
