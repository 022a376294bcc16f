"""`python -m toolkit.serve`: the OpenAI-compatible server on one command.

    python -m toolkit.serve                                  # the embedded SmolLM2, 127.0.0.1:8000
    python -m toolkit.serve path/to/hf-folder --port 8080 --api-key sk-local --max-num-seqs 64
    python -m toolkit.serve --engine-arg speculative='"ngram"' --engine-arg num_speculative_tokens=3

Engine options are LLM(...) keyword arguments: the common ones have flags, any other goes
through --engine-arg NAME=VALUE (VALUE read as a Python literal, else as a string).
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
from typing import Any, Sequence


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m toolkit.serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None,
                   help="a Hugging Face folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the folder's name, or smollm2-135m-instruct)")
    p.add_argument("--api-key", default=os.environ.get("TOOLKIT_API_KEY"),
                   help="require `Authorization: Bearer KEY` (default: $TOOLKIT_API_KEY, else none)")
    p.add_argument("--max-pending", type=int, default=None,
                   help="503 + Retry-After past this many unfinished requests (default: no limit)")
    p.add_argument("--max-request-body-bytes", type=int, default=8 << 20,
                   help="413 for a larger request body, before it is parsed (default 8 MiB)")
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host header names the server answers (against DNS "
                        "rebinding); default: the loopback names when bound to loopback, else any")
    p.add_argument("--protect-metrics", action="store_true",
                   help="/metrics needs the API key too (default: open, as vLLM's; /health stays open)")
    p.add_argument("--shutdown-timeout", type=float, default=5.0,
                   help="seconds running requests may finish in after a shutdown signal")
    p.add_argument("--scheduler", default="continuous")
    p.add_argument("--allocator", default=None)
    p.add_argument("--attention", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--dtype", default=None)
    # vLLM's flags, same meanings
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs (cuda_graphs=False)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or a file holding one, in place of the tokenizer's")
    p.add_argument("--load-format", default="auto", help="auto, safetensors, pt or dummy (random weights)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="NAME=VALUE",
                   help="any other LLM(...) option; repeatable")
    p.add_argument("--engine", choices=["process", "thread"], default="process",
                   help="where the engine loop runs: its own process (default; the HTTP side never "
                        "holds its GIL, so serving keeps close to LLM.generate's throughput; "
                        "docs/decisions/0003-engine-in-its-own-process.md) or a thread of the "
                        "server's process")
    p.add_argument("--tool-call-parser", default="auto",
                   choices=["auto", "hermes", "llama3_json", "pythonic"],
                   help="how the model writes tool calls (default auto: from the chat template; a "
                        "template without a tools section gets the Hermes <tool_call> prompt)")
    p.add_argument("--enable-auto-tool-choice", action=argparse.BooleanOptionalAction, default=True,
                   help="parse tool calls the model chooses to make (tool_choice auto, the default "
                        "with tools); vLLM's flag, on by default here")
    p.add_argument("--reasoning-parser", default=None, choices=["qwen3", "deepseek_r1"],
                   help="split <think>...</think> into the message's reasoning_content")
    p.add_argument("--kv-role", choices=["producer", "consumer"], default=None,
                   help="prefill/decode disaggregation (docs/guides/kv-transfer.md): this server "
                        "prefills and hands the KV off (producer) or loads it and decodes (consumer), "
                        "through --kv-cache-dir, a directory both servers see; run "
                        "`python -m toolkit.kv_transfer.http_proxy` in front of the two")
    p.add_argument("--kv-cache-dir", default=None,
                   help="alone: the disk tier's directory (kept across restarts); with --kv-role: "
                        "the handoff directory (e.g. under /dev/shm)")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {"scheduler": args.scheduler, "attention": args.attention,
                            "load_format": args.load_format}
    for flag in ("allocator", "max_num_seqs", "max_model_len", "block_size", "dtype",
                 "gpu_memory_utilization", "tensor_parallel_size", "seed", "enable_prefix_caching"):
        if getattr(args, flag, None) is not None:
            opts[flag] = getattr(args, flag)
    if getattr(args, "enforce_eager", False):
        opts["cuda_graphs"] = False
    if getattr(args, "kv_role", None):             # [kv_transfer] toolkit/kv_transfer/pd.py
        opts.update(kv_connector="pd", kv_role="kv_" + args.kv_role)
    if getattr(args, "kv_cache_dir", None):
        opts["kv_cache_dir"] = args.kv_cache_dir
    for item in args.engine_arg:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--engine-arg takes NAME=VALUE, got {item!r}")
        try:
            opts[name.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            opts[name.strip()] = value
    return opts


def read_chat_template(value: str) -> str:
    """--chat-template: a file's text if it names one, else the template itself."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:
        raise SystemExit(f"--chat-template {value!r} is neither a file nor a Jinja template")
    return value


def allowed_hosts(args: argparse.Namespace) -> list[str] | None:
    """--allowed-hosts, or the loopback names for a loopback bind (None: any host)."""
    from toolkit.serving.guard import LOOPBACK_HOSTS

    if args.allowed_hosts:
        return [h.strip() for h in args.allowed_hosts.split(",") if h.strip()]
    if args.host in ("127.0.0.1", "localhost", "::1") or args.host.startswith("127."):
        return list(LOOPBACK_HOSTS) + [args.host]
    return None


def main(argv: Sequence[str] | None = None) -> None:
    try:
        import uvicorn
    except ImportError as e:              # the optional extra is missing
        raise SystemExit("the server needs the serve extra: pip install -e '.[serve]'") from e
    from toolkit.entrypoints.async_engine import AsyncEngine
    from toolkit.serving.app import build_app
    from toolkit.serving.tools.request import ToolConfig

    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    name = args.served_model_name or (os.path.basename(os.path.normpath(args.model)) if args.model
                                      else "smollm2-135m-instruct")
    engine = AsyncEngine.build(args.model, process=args.engine == "process", **engine_options(args))
    if args.chat_template is not None:           # the server renders chats with this tokenizer copy
        engine.tokenizer.chat_template = read_chat_template(args.chat_template)
    dead: list[bool] = []
    server: list[Any] = []

    def engine_dead() -> None:             # stop serving; exit non-zero below
        dead.append(True)
        server[0].should_exit = True

    app = build_app(engine, model_name=name, api_key=args.api_key, max_pending=args.max_pending,
                    shutdown_timeout=args.shutdown_timeout, max_body_bytes=args.max_request_body_bytes,
                    allowed_hosts=allowed_hosts(args), protect_metrics=args.protect_metrics,
                    on_engine_dead=engine_dead,
                    tools=ToolConfig(args.tool_call_parser, args.enable_auto_tool_choice,
                                     args.reasoning_parser))
    server.append(uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                                timeout_graceful_shutdown=int(args.shutdown_timeout) + 1)))
    server[0].run()
    if dead:
        raise SystemExit("the engine stopped while serving: exiting with an error so that a "
                         f"supervisor restarts the server ({engine.error!r})")


if __name__ == "__main__":
    main()
