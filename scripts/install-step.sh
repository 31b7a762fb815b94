#!/usr/bin/env bash
# install-step.sh LOG LABEL COMMAND [ARG...]: one step of `make install`, quietly. Prints "[install] LABEL ... ok (Ns)"
# and appends COMMAND's output (stdout and stderr) to LOG. If COMMAND fails: the line ends in FAILED, the last lines
# of LOG and its path go to stderr, and the exit status is COMMAND's.
set -u
log=$1 label=$2
shift 2
mkdir -p "$(dirname "$log")"
printf '[install] %s ... ' "$label"
{
	printf '\n=== [install] %s\n$' "$label"
	printf ' %q' "$@"
	printf '\n'
} >>"$log"
start=$SECONDS
"$@" >>"$log" 2>&1
status=$?
if [ "$status" -eq 0 ]; then
	printf 'ok (%ds)\n' $((SECONDS - start))
	exit 0
fi
printf 'FAILED (exit %d)\n' "$status"
{
	printf -- '--- the last 30 lines of %s:\n' "$log"
	tail -n 30 "$log"
	printf -- '--- make install failed at "%s" (exit %d); the full output: %s\n' "$label" "$status" "$log"
} >&2
exit "$status"
