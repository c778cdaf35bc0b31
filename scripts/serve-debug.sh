#!/usr/bin/env bash
# Start the debug profile: the OCR VLM in plain PyTorch (engine.kind transformers), one page at a
# time, for stepping through a page on a machine without vLLM. Arguments go to `ocrserve launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f ocrserve/profiles/debug.yaml ]; then
  echo "serve-debug: debug mode (engine.kind transformers) is not built yet: ocrserve/profiles/debug.yaml does not exist." >&2
  echo "serve-debug: meanwhile use 'ocrserve launch' (CPU, ONNX) or scripts/serve-vllm.sh on a GPU." >&2
  exit 1
fi
exec ocrserve launch --profile debug "$@"
