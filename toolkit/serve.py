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
    p.add_argument("--generation-config", default="auto",
                   help="sampling defaults for fields a request leaves unset: auto (the model folder's "
                        "generation_config.json), vllm (none: SamplingParams' defaults), or a folder "
                        "holding a generation_config.json")
    p.add_argument("--enable-log-requests", action="store_true",
                   help="log each request (id, prompt tokens, the sampling fields it sets) at INFO")
    p.add_argument("--disable-log-requests", action="store_true",
                   help="vLLM's older flag: requests are not logged (the default here); overrides "
                        "--enable-log-requests")
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
    p.add_argument("--enable-sleep-mode", action="store_true",
                   help="build the engine with enable_sleep_mode and serve the development routes "
                        "/sleep, /wake_up, /is_sleeping, /reset_prefix_cache (404 without it)")
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="engine replicas behind this one server, each request routed to one "
                        "(docs/guides/replicas.md)")
    p.add_argument("--data-parallel-backend", choices=["mp", "ray", "thread"], default="mp",
                   help="replicas as engine processes on this host (mp, one GPU each where there are "
                        "several), Ray actors on the Ray cluster (ray; pip install -e '.[ray]'), or "
                        "threads of the server (thread)")
    p.add_argument("--router", default="least_loaded",
                   choices=["round_robin", "least_loaded", "power_of_two", "prefix_affinity", "cache_aware"],
                   help="which replica serves a request (with --data-parallel-size > 1)")
    p.add_argument("--data-parallel-max-restarts", type=int, default=3,
                   help="times each replica is started again after it dies (0: never; a back-off "
                        "of 1 s doubling per attempt)")
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (vLLM's flag)")
    p.add_argument("--max-loras", type=int, default=None, help="distinct adapters in one step")
    p.add_argument("--max-lora-rank", type=int, default=None)
    p.add_argument("--max-cpu-loras", type=int, default=None)
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                   help="adapters served by name (a request's `model`), e.g. sql=/adapters/sql")
    p.add_argument("--allow-runtime-lora-updating", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
                   help="add /v1/load_lora_adapter and /v1/unload_lora_adapter (default: "
                        "$VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
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
                            "load_format": args.load_format, "generation_config": args.generation_config}
    for flag in ("allocator", "max_num_seqs", "max_model_len", "block_size", "dtype",
                 "gpu_memory_utilization", "tensor_parallel_size", "seed", "enable_prefix_caching",
                 "max_loras", "max_lora_rank", "max_cpu_loras"):
        if getattr(args, flag, None) is not None:
            opts[flag] = getattr(args, flag)
    if getattr(args, "enforce_eager", False):
        opts["cuda_graphs"] = False
    if getattr(args, "enable_sleep_mode", False):
        opts["enable_sleep_mode"] = True
    if getattr(args, "enable_lora", False):
        opts["enable_lora"] = True
    elif getattr(args, "lora_modules", None) or getattr(args, "allow_runtime_lora_updating", False):
        raise SystemExit("--lora-modules and --allow-runtime-lora-updating need --enable-lora")
    if getattr(args, "kv_role", None):             # [kv_transfer] toolkit/kv_transfer/pd.py
        opts.update(kv_connector="pd", kv_role="kv_" + args.kv_role)
        if args.kv_role == "consumer":             # the proxy asks before the producer's write may land
            opts.setdefault("kv_handoff_wait_s", 10.0)
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


def sampling_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """--generation-config: the sampling defaults requests get (models/generation_defaults.py)."""
    from toolkit.models.generation_defaults import generation_defaults

    folder = args.model
    if folder is None and args.generation_config == "auto":
        from toolkit.models import default_model_path

        folder = default_model_path()
    try:
        return generation_defaults(args.generation_config, folder)
    except ValueError as e:
        raise SystemExit(f"--generation-config: {e}") from None


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
    from toolkit.serving.lora import parse_lora_modules

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    name = args.served_model_name or (os.path.basename(os.path.normpath(args.model)) if args.model
                                      else "smollm2-135m-instruct")
    try:                                  # before any engine starts: a bad adapter is a message
        lora_modules = parse_lora_modules(args.lora_modules)
        if args.enable_lora and lora_modules:
            from toolkit.serving.lora import LoRAModules

            LoRAModules(name, lora_modules)           # each folder read and checked
    except ValueError as e:
        raise SystemExit(f"--lora-modules: {e}") from None
    if args.data_parallel_size < 1:
        raise SystemExit(f"--data-parallel-size must be at least 1, got {args.data_parallel_size}")
    if args.data_parallel_size > 1 or args.data_parallel_backend == "ray":
        from toolkit.entrypoints.data_parallel import DPAsyncEngine

        engine = DPAsyncEngine(args.model, data_parallel_size=args.data_parallel_size,
                               backend=args.data_parallel_backend, router=args.router,
                               max_restarts=args.data_parallel_max_restarts, **engine_options(args))
    else:
        engine = AsyncEngine.build(args.model, process=args.engine == "process", **engine_options(args))
    defaults = sampling_defaults(args)
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
                    on_engine_dead=engine_dead, sampling_defaults=defaults,
                    log_requests=args.enable_log_requests and not args.disable_log_requests,
                    tools=ToolConfig(args.tool_call_parser, args.enable_auto_tool_choice,
                                     args.reasoning_parser),
                    enable_sleep_mode=args.enable_sleep_mode,
                    lora_modules=lora_modules if args.enable_lora else None,
                    allow_runtime_lora_updating=args.enable_lora and args.allow_runtime_lora_updating)
    server.append(uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                                timeout_graceful_shutdown=int(args.shutdown_timeout) + 1)))
    server[0].run()
    if dead:
        raise SystemExit("the engine stopped while serving: exiting with an error so that a "
                         f"supervisor restarts the server ({engine.error!r})")


if __name__ == "__main__":
    main()
