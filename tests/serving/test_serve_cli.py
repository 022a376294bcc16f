"""`python -m toolkit.serve`: the command a user runs, started as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from toolkit.serve import engine_options, parse_args

pytest.importorskip("uvicorn")


def test_engine_options_from_flags():
    args = parse_args(["some/dir", "--max-num-seqs", "8", "--engine-arg", "speculative='ngram'",
                       "--engine-arg", "num_speculative_tokens=3", "--engine-arg", "policy=priority"])
    opts = engine_options(args)
    assert opts["max_num_seqs"] == 8 and opts["speculative"] == "ngram"
    assert opts["num_speculative_tokens"] == 3 and opts["policy"] == "priority"
    assert args.host == "127.0.0.1"
    with pytest.raises(SystemExit):
        engine_options(parse_args(["--engine-arg", "novalue"]))


def test_serve_command_answers_and_stops(tiny_chat_dir):
    from server_util import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.serve", tiny_chat_dir, "--port", str(port),
                             "--served-model-name", "tiny", "--engine-arg", "num_blocks=64",
                             "--log-level", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"server did not start: {proc.stdout.read().decode()[-2000:]}")
                time.sleep(0.2)
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 3}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=60).read())
        assert out["object"] == "chat.completion" and out["usage"]["completion_tokens"] >= 1
    finally:
        proc.terminate()                         # SIGTERM: uvicorn's graceful shutdown
        code = proc.wait(timeout=60)
    log = proc.stdout.read().decode()
    # uvicorn re-raises the signal after its shutdown (exit status -15); the lifespan ran
    assert code in (0, -15) and "Application shutdown complete" in log, log[-2000:]
