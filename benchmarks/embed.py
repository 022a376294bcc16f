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

--out writes the run as a benchmark record (benchmarks/record.py, with the raw numbers);
--keep ID also adds it to the machine's summary (--summary FILE: that file instead, e.g. the
summaries/cpu-2core-xeon.json the CPU figures share, with --machine naming the CPU as its
records do), whose headline figure `python -m benchmarks report` puts in the README.
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


def bert_base_folder(tmp: Path, dtype: torch.dtype) -> Path:
    """A random BERT-base as a sentence-transformers folder (MiniLM's tokenizer: the same vocabulary)."""
    import shutil

    import transformers as tf

    from toolkit.models import embedding_model_path

    src = embedding_model_path()
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
    ap.add_argument("--out", default=None, help="write the benchmark record (with raw output) here")
    ap.add_argument("--keep", default=None, metavar="ID", help="add the record to a summary file as ID")
    ap.add_argument("--summary", default=None, help="the summary file --keep writes (default: the machine's)")
    ap.add_argument("--machine", default=None, help="the CPU's description in the record (default: platform's)")
    a = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    from toolkit import LLM
    from toolkit.models import embedding_model_path

    gpu = a.device.startswith("cuda")
    dtype = torch.bfloat16 if gpu else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        folder = bert_base_folder(Path(tmp), dtype) if gpu else embedding_model_path()
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
        "min_cosine": cos, "repeats": rows, "gpu": gpu,
    }
    print(json.dumps(result, indent=1))
    rec = to_record(result, a)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(rec, indent=1))
    if a.keep:
        print("kept in", keep_record(rec, a.keep, a.summary))


def figure_name(result: dict) -> str:
    where = result["device"] if result["gpu"] else "a CPU"
    return f"{result['model']} embeddings on {where}, {result['texts']} texts of 4-120 words"


def to_record(result: dict, a: argparse.Namespace) -> dict:
    """The run as a benchmark record: one figure (embeddings/s against sentence-transformers,
    the median of per-repeat ratios), the raw numbers kept."""
    from benchmarks.record import figure, make_record

    fig = figure(figure_name(result), round(result["toolkit_emb_s"], 1), "emb/s", peer="sentence-transformers",
                 peer_value=round(result["st_emb_s"], 1), ratio=round(result["median_ratio"], 3),
                 config={"texts": result["texts"], "st_batch_size": result["st_batch_size"],
                         "threads": result["threads"], "repeats": len(result["repeats"])})
    fig["ratio"] = round(fig["value"] / fig["peer_value"], 3)   # value / peer_value (the validator's rule)
    cmd = (f"python -m benchmarks embed --device {a.device} --texts {a.texts} --batch-size {a.batch_size} "
           f"--repeats {a.repeats}")
    notes = (f"same texts, same process, alternating; median per-repeat ratio {result['median_ratio']:.2f}; "
             f"smallest cosine against sentence-transformers {result['min_cosine']:.6f}")
    rec = make_record("embed", cmd, [fig], raw=result, notes=notes)
    if a.machine:
        rec["machine"]["cpu"] = a.machine
    if a.out:
        rec["source"] = a.out
    return rec


def keep_record(rec: dict, record_id: str, summary: str | None) -> Path:
    """record.keep, into `summary` when given (the figure is the README's headline)."""
    from benchmarks.record import keep, validate

    name = rec["figures"][0]["name"]
    if summary is None:
        return keep(rec, record_id, headline=[name])
    kept = {k: v for k, v in rec.items() if k != "raw"}
    kept["id"] = record_id
    kept["figures"] = [{**f, "headline": True} for f in rec["figures"]]
    validate(kept)
    path = Path(summary)
    records = [r for r in json.loads(path.read_text()) if r.get("id") != record_id] + [kept]
    path.write_text(json.dumps(records, indent=1) + "\n")
    return path


if __name__ == "__main__":
    main()
