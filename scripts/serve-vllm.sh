#!/usr/bin/env bash
# Run vLLM alone with the flags ocrserve plans for it: prints the `vllm serve` command line that
# `ocrserve plan --format argv` computes for a profile and GPU, then execs it. Arguments go to
# `ocrserve plan` (default profile: prod; default GPU: auto-detected).
#
#   scripts/serve-vllm.sh                                  # prod profile, this machine's GPU
#   scripts/serve-vllm.sh --profile gpu-24g --gpu auto
#   DRY_RUN=1 scripts/serve-vllm.sh --gpu "RTX 4090D"      # print the command only
#
# A gateway in front of it (on this or another machine), with N the printed --max-num-seqs:
#   ocrserve launch --profile prod --set 'engine.vllm.base_urls=[http://127.0.0.1:8001]' --set vllm.max_num_seqs=N
# `ocrserve launch --profile prod` does both in one go, and restarts vLLM if it dies.
set -euo pipefail
cd "$(dirname "$0")/.."
# the checkout's venv (README: Fresh machine) when it has one, else ocrserve on PATH
ocrserve=ocrserve
[ -x .venv/bin/ocrserve ] && ocrserve=.venv/bin/ocrserve
command="$("$ocrserve" plan --format argv "$@")"
echo "$command" >&2
if [ -n "${DRY_RUN:-}" ]; then
  exit 0
fi
eval "exec $command"
