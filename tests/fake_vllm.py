#!/usr/bin/env python3
"""A stand-in ``vllm`` executable for launcher tests: ``vllm serve MODEL --host H --port P ...``
becomes ``python -m ocrserve engine serve --backend onnx`` serving MODEL on H:P (every other flag
is ignored). The Python running this script runs the engine, so it must have ocrserve installed.

Environment:
    FAKE_VLLM_FAIL: print this line and exit 1 instead (a vLLM that dies at start-up).
"""

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, ignored = parser.parse_known_args()
    print(f"fake vllm: serve {args.model} on {args.host}:{args.port} (ignoring {len(ignored)} args)", flush=True)
    if os.environ.get("FAKE_VLLM_FAIL"):
        print(os.environ["FAKE_VLLM_FAIL"], flush=True)
        sys.exit(1)
    os.execv(
        sys.executable,
        [
            sys.executable,
            "-m",
            "ocrserve",
            "engine",
            "serve",
            "--backend",
            "onnx",
            "--host",
            args.host,
            "--port",
            str(args.port),
            "--served-model-name",
            args.model,
            "--set",
            "preprocess.workers=1",
        ],
    )


if __name__ == "__main__":
    main()
