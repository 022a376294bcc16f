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


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(x) for x in f.read().split()]
    return kids


@pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{os.getpid()}/children"),
                    reason="reads /proc/<pid>/task/<tid>/children for the engine's pid")
def test_serve_exits_non_zero_when_the_engine_dies(tiny_chat_dir):
    """Issue 54 item 9: after the engine process died the server answered 503 "shutting
    down" forever; now it stops and exits non-zero, so a supervisor restarts it."""
    import signal

    from server_util import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.serve", tiny_chat_dir, "--port", str(port),
                             "--served-model-name", "tiny", "--engine-arg", "num_blocks=64"],
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
        engines = [k for k in _children(proc.pid)         # multiprocessing's spawned child
                   if "spawn_main" in open(f"/proc/{k}/cmdline").read()]
        assert engines, "no engine process"
        for k in engines:                        # the engine process this test's server started
            os.kill(k, signal.SIGKILL)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = proc.stdout.read().decode()
    assert code == 1 and "the engine stopped while serving" in log, log[-2000:]
