"""Cost model: the seconds of one engine step from what the step contains, and the host
seconds of admitting a request.

    t = c_const + c_prefill * prefill_tokens + c_decode * decode_seqs
        + c_decode_kv * decode_kv_tokens + c_prefill_attn * prefill_attn_ktokens
        + c_prefill_seqs * prefill_seqs + c_eager * eager_steps + c_mixed * mixed_ktokens
        + c_moe * moe_experts + c_lora_tok * lora_tokens + c_lora * lora_adapters

- prefill_tokens: tokens of prompt (or recompute) chunks: the GEMMs' rows beyond decode.
- decode_seqs: sequences decoding one token (+ drafts) this step.
- decode_kv_tokens: KV tokens the decodes' attention reads (sum of their context lengths):
  the memory-bound term.
- prefill_attn_ktokens: query x key pairs of the prefill chunks' causal attention, / 1000:
  the quadratic term of long prompts.
- prefill_seqs: prompt chunks in the step: what a sequence's prefill costs beyond its
  tokens (its attention tiles and metadata rows, the scheduler's prefix-cache lookup and
  block allocation on admission). Told apart from the tokens by calibration steps that
  carry k prompts of P / k tokens next to ones that carry one of P.
- eager_steps: 1 for a step of more tokens than the engine replays from CUDA graphs
  (`graph_tokens`, the largest graph bucket; None: no graphs, the feature is 0). Such a
  step runs the model eagerly, one Python launch per kernel: on the H200, with graphs to 128
  tokens, an 8B step of 129 to 512 tokens took 17-21 ms where one of 128 took 5.4 ms, a floor
  no per-token term fits.
- mixed_ktokens: prefill_tokens x decode_seqs / 1000 in a step that is not eager: a prompt
  chunk beside many decodes costs more than the two apart (H200, 8B: 333 prompt tokens beside
  ~120 decodes, 17.1 ms of GPU time against 12.6 modelled without it; with the term, a fit
  to one load predicts the other load's steps of that kind within 5%;
  docs/decisions/0008-simulator-cost-model.md). Empirical: such steps run attention eagerly
  between CUDA-graph pieces, and where the extra time goes is not measured.

- moe_experts (a mixture-of-experts model; 0 for a dense one): the expected number of
  distinct experts of a layer that the step's T tokens touch, each picking its top-k of E,
  E * (1 - (1 - k / E)^T) (`experts_touched`: k at T = 1, E once T is large). A touched
  expert's weights are read once per step whatever its tokens (the fused kernel's grouped
  GEMM; the CPU path's per-expert loop), so this is the MoE step's weight-read term: a
  decode batch of 1 reads k experts, not E, and the cost grows with the batch until every
  expert is read. The FLOPs follow active, not total, parameters too: a token runs k
  experts, which the per-token terms (prefill_tokens, decode_seqs) carry, fitted on the
  MoE model (a tokens x k feature would be k times those columns, with nothing to tell
  them apart). Uniform routing is assumed; a skewed router touches fewer.

- lora_tokens, lora_adapters (multi-LoRA; 0 for a step of base requests): the step's tokens
  that run an adapter, and the distinct adapters among them. The batched LoRA kernels
  (S-LoRA / Punica: one shrink x A^T and one expand h B^T per projection over per-token slot
  indices) do work per adapter token — the FLOPs, rank R against the hidden size, and each
  token's gathered A/B rows in a decode tile — and read each running adapter's A and B once
  per step for a prefill chunk's tiles (a GEMM per adapter), so a step of 8 distinct adapters
  costs more than one of 8 requests of one adapter. Base tokens cost nothing (their tiles
  skip). Fitted like the others, from steps recorded on an engine serving adapters
  (`TraceRecorder`: step_features reads each request's lora_request); a profile without
  adapters leaves both 0. Slot loads (copying an adapter in) are not a step feature: the
  Simulator charges them (`lora_load_s`), as the scheduler's pool decides them.

Admission (`admission`, outside any step): the host seconds of `engine.add_request` for a
prompt of n tokens, `per_request + per_token * n` (validating and copying the prompt ids,
building the Request). Whoever drives the engine (LLM.generate, the serving core,
replay.run_on_engine) calls it between two steps, so the next step, and with it the new
request's first token and every running request's next one, starts that much later. A
profile of step() calls alone never sees it; the Simulator charges it when a request
arrives (`CostModel.admission_time`).

Linear in these features, so it is fitted by least squares (non-negative, relative error)
from (step, seconds) samples: a profile of the real engine (benchmarks/sim_calibrate.py,
or `calibrate.profile_engine` on any device). Coefficients are data: JSON files in
toolkit/simulator/data/ keyed "<device>/<model shape>", or any path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from toolkit.types import ScheduledRequest, SchedulerOutput

FEATURES = ("const", "prefill_tokens", "decode_seqs", "decode_kv_tokens", "prefill_attn_ktokens", "prefill_seqs",
            "eager_steps", "mixed_ktokens", "moe_experts", "lora_tokens", "lora_adapters")
_PREFILL, _DECODE, _EAGER, _MIXED = (FEATURES.index(f) for f in
                                     ("prefill_tokens", "decode_seqs", "eager_steps", "mixed_ktokens"))
ADMISSION = ("per_request", "per_token")     # host seconds of add_request: + per prompt token
DATA_DIR = Path(__file__).parent / "data"
DEFAULT_FILE = DATA_DIR / "cost_models.json"


def _is_decode(s: ScheduledRequest) -> bool:
    # valid before and after update(): one token (+ drafts) past the prompt
    return s.num_new_tokens == 1 + s.num_spec_tokens and s.start >= s.request.num_prompt_tokens


def experts_touched(tokens, num_experts: int, top_k: int):
    """Expected distinct experts of one layer that `tokens` tokens touch when each picks top_k
    of num_experts uniformly: E * (1 - (1 - k / E)^T); 0 at T = 0."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** np.asarray(tokens, dtype=np.float64))


def moe_routing(config: Any) -> dict[str, int]:
    """{"num_experts": E, "top_k": k} of a Hugging Face config of a mixture-of-experts model
    (num_local_experts | num_experts | n_routed_experts, num_experts_per_tok); {} for a
    dense one."""
    k = getattr(config, "num_experts_per_tok", None)
    e = next((getattr(config, n) for n in ("num_local_experts", "num_experts", "n_routed_experts")
              if getattr(config, n, None)), None)
    return {"num_experts": int(e), "top_k": int(k)} if e and k else {}


def step_features(out: SchedulerOutput, graph_tokens: int | None = None,
                  moe: dict[str, int] | None = None) -> np.ndarray:
    """float64 [len(FEATURES)] of one step's plan (before or after its update); graph_tokens:
    the most tokens a step of the engine replays from CUDA graphs (None: it has none); moe:
    the model's routing ({"num_experts", "top_k"}; None or {}: dense, moe_experts 0)."""
    prefill = decode = decode_kv = chunks = tokens = lora_tokens = 0
    attn = 0.0
    adapters: set[int] = set()
    for s in out.scheduled:
        tokens += s.num_new_tokens
        lora = getattr(s.request, "lora_request", None)
        if lora is not None:
            lora_tokens += s.num_new_tokens
            adapters.add(lora.lora_int_id)
        if _is_decode(s):
            decode += 1
            decode_kv += s.end
        else:
            prefill += s.num_new_tokens
            chunks += 1
            attn += s.num_new_tokens * (s.start + s.end + 1) / 2 / 1000.0   # causal pairs
    eager = float(graph_tokens is not None and tokens > graph_tokens)
    mixed = float(mixed_ktokens(prefill, decode, eager))
    experts = float(experts_touched(tokens, moe["num_experts"], moe["top_k"])) if moe else 0.0
    return np.array([1.0, prefill, decode, decode_kv, attn, chunks, eager, mixed, experts, lora_tokens,
                     len(adapters)], dtype=np.float64)


def as_features(x, *, one_step: bool = False) -> np.ndarray:
    """float64 [..., len(FEATURES)]: feature vectors recorded before a feature was added are
    padded with zeros (their steps are read as if the new feature were absent). one_step:
    each vector is one step's (or the mean of identical steps'), so a vector recorded before
    mixed_ktokens gets it computed from its prompt tokens, decodes and eager flag (for a sum
    of different steps, a window, the product of sums would be wrong: it stays 0)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if n < len(FEATURES):
        pad = [(0, 0)] * (x.ndim - 1) + [(0, len(FEATURES) - n)]
        x = np.pad(x, pad)
        if one_step and n <= FEATURES.index("mixed_ktokens"):
            x[..., _MIXED] = mixed_ktokens(x[..., _PREFILL], x[..., _DECODE], x[..., _EAGER])
    return x


def mixed_ktokens(prefill_tokens, decode_seqs, eager):
    """The mixed_ktokens feature of one step: prompt tokens x decodes / 1000 unless eager."""
    return np.where(eager > 0, 0.0, np.asarray(prefill_tokens) * decode_seqs / 1000.0)


@dataclass
class CostModel:
    """Seconds of a step = coef . step_features(out, graph_tokens); host seconds of admitting
    a request = admission["per_request"] + admission["per_token"] * prompt tokens (none: 0).
    `source` says where the numbers come from. graph_tokens: the largest step the calibrated
    engine replayed from CUDA graphs (`EngineConfig.graph_tokens`, `Runner.graph_tokens`); set
    it to simulate an engine whose limit differs. moe: the model's routing, {"num_experts": E,
    "top_k": k} (`moe_routing(config)`; empty for a dense model): what moe_experts counts."""

    coef: dict[str, float]
    source: str = "unfitted"
    fit_error: dict[str, float] = field(default_factory=dict)   # mean / max relative error of the fit
    admission: dict[str, float] = field(default_factory=dict)
    graph_tokens: int | None = None
    moe: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, table, valid in (("cost features", self.coef, FEATURES), ("admission terms", self.admission, ADMISSION)):
            unknown = sorted(set(table) - set(valid))
            if unknown:
                raise ValueError(f"unknown {what} {unknown}; valid: {list(valid)}")
            bad = {k: v for k, v in table.items() if not (isinstance(v, (int, float)) and v >= 0)}
            if bad:
                raise ValueError(f"cost coefficients must be numbers >= 0, got {bad}")
        if self.moe:
            e, k = self.moe.get("num_experts"), self.moe.get("top_k")
            if set(self.moe) != {"num_experts", "top_k"} or not (isinstance(e, int) and isinstance(k, int)
                                                                 and 1 <= k <= e):
                raise ValueError(f"moe must be {{'num_experts': E, 'top_k': k}} with 1 <= k <= E, got {self.moe}")
        self._vec = np.array([float(self.coef.get(f, 0.0)) for f in FEATURES])

    def admission_time(self, prompt_len: int) -> float:
        """Host seconds of add_request for a prompt of prompt_len tokens (outside the steps)."""
        a = self.admission
        return float(a.get("per_request", 0.0) + a.get("per_token", 0.0) * prompt_len)

    def __call__(self, out: SchedulerOutput) -> float:
        return self.predict(out)

    def predict(self, out: SchedulerOutput) -> float:
        return float(self._vec @ step_features(out, self.graph_tokens, self.moe))

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        return as_features(x) @ self._vec

    def finish_estimate(self, *, batch: int = 32, context: int = 1024, prefill_chunk: int = 2048):
        """`estimate(request, now) -> seconds` for `EDF(estimate=...)`: the prompt left, in
        chunks of prefill_chunk tokens, then each output token left at the time of a decode
        step of `batch` sequences at `context` tokens (output left: expected_output_len if
        given, else max_tokens)."""
        c = self.coef
        step = c.get("const", 0.0) + batch * (c.get("decode_seqs", 0.0) + context * c.get("decode_kv_tokens", 0.0))
        if self.moe:
            step += c.get("moe_experts", 0.0) * float(experts_touched(batch, **self.moe))

        def estimate(request, now: float) -> float:
            p = max(request.num_tokens - request.num_computed_tokens, 0)
            chunks = -(-p // prefill_chunk)
            prefill = (chunks * (c.get("const", 0.0) + c.get("prefill_seqs", 0.0)) + p * c.get("prefill_tokens", 0.0)
                       + c.get("prefill_attn_ktokens", 0.0) * p * (p + 1) / 2 / 1000.0)
            want = request.expected_output_len
            if want is None:
                want = request.sampling_params.max_tokens
            return prefill + max(want - request.num_output_tokens, 1) * step

        return estimate

    # -- fitting --
    @classmethod
    def fit(cls, samples: Iterable[tuple[np.ndarray | SchedulerOutput, float]], *,
            source: str = "fitted", features: Sequence[str] = FEATURES,
            weights: Sequence[float] | None = None, admission: dict[str, float] | None = None,
            graph_tokens: int | None = None, moe: dict[str, int] | None = None) -> "CostModel":
        """Least squares on relative error with non-negative coefficients, scaled so the
        predicted total equals the measured total, over samples of (step features or
        SchedulerOutput, measured seconds); a sample may also be the sum of several steps'
        features against the sum of their seconds (the model is linear). `features` may
        leave some out (their coefficient is 0); `weights` weigh the samples' relative
        errors (e.g. so two sources count alike); `admission` and `graph_tokens` (the
        engine's, as the samples' eager_steps were counted) and `moe` (the model's routing, as
        their moe_experts were counted) are kept as given."""
        xs, ys = [], []
        for x, y in samples:
            xs.append(step_features(x, graph_tokens, moe) if isinstance(x, SchedulerOutput) else as_features(x))
            ys.append(float(y))
        X, y = (np.stack(xs), np.array(ys)) if xs else (np.zeros((0, len(FEATURES))), np.zeros(0))
        cols = [FEATURES.index(f) for f in features]
        # a feature that is 0 in every sample (eager steps without graphs, mixed steps a
        # profile did not run) has nothing to fit: its coefficient stays 0
        active = [f for f, c in zip(features, cols) if X[:, c].any()] if len(xs) else list(features)
        if len(xs) < max(len(active), 1):
            raise ValueError(f"fitting {len(active)} coefficients (the features not 0 in every sample: "
                             f"{active}) needs at least that many samples, got {len(xs)}")
        if np.any(y <= 0):
            raise ValueError("measured step times must be > 0 seconds")
        sw = np.ones_like(y) if weights is None else np.sqrt(np.asarray(weights, dtype=np.float64))
        if sw.shape != y.shape or np.any(~np.isfinite(sw)) or np.any(sw < 0):
            raise ValueError(f"weights must be {len(y)} numbers >= 0, one per sample")
        # rows scaled by 1/y: relative error (and by sqrt(weight): a weighted sum of squares)
        w = _nnls(X[:, cols] * (sw / y)[:, None], sw)
        # relative least squares runs low on noisy samples (it minimises (pred - y) / y); scale
        # so the predicted total time is the (weighted) measured total: a run keeps its length
        pred = X[:, cols] @ w
        if pred @ sw ** 2 > 0:
            w = w * ((y @ sw ** 2) / (pred @ sw ** 2))
        coef = dict.fromkeys(FEATURES, 0.0)
        for c, v in zip(cols, w):
            coef[FEATURES[c]] = float(v)
        model = cls(coef, source=source, admission=dict(admission or {}), graph_tokens=graph_tokens,
                    moe=dict(moe or {}))
        rel = np.abs(model.predict_features(X) - y) / y
        model.fit_error = {"mean_rel": float(rel.mean()), "max_rel": float(rel.max()), "samples": len(y)}
        return model

    # -- data --
    def to_dict(self) -> dict:
        return {"coef": dict(self.coef), "source": self.source, "fit_error": dict(self.fit_error),
                "admission": dict(self.admission), "graph_tokens": self.graph_tokens,
                **({"moe": dict(self.moe)} if self.moe else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        return cls(dict(d["coef"]), source=d.get("source", "?"), fit_error=dict(d.get("fit_error", {})),
                   admission=dict(d.get("admission", {})), graph_tokens=d.get("graph_tokens"),
                   moe=dict(d.get("moe", {})))

    def save(self, key: str, path: str | Path = DEFAULT_FILE) -> None:
        """Add or replace entry `key` ("<device>/<model shape>") in the JSON file at path."""
        path = Path(path)
        table = json.loads(path.read_text()) if path.exists() else {}
        table[key] = self.to_dict()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, key: str, path: str | Path = DEFAULT_FILE) -> "CostModel":
        path = Path(path)
        table = json.loads(path.read_text()) if path.exists() else {}
        if key not in table:
            raise ValueError(f"no cost model {key!r} in {path}; available: {sorted(table)} "
                             "(fit one with benchmarks/sim_calibrate.py or calibrate.profile_engine)")
        return cls.from_dict(table[key])

    @staticmethod
    def available(path: str | Path = DEFAULT_FILE) -> list[str]:
        path = Path(path)
        return sorted(json.loads(path.read_text())) if path.exists() else []

    def __repr__(self) -> str:
        terms = ", ".join(f"{k}={v:.3g}" for k, v in self.coef.items() if v)
        adm = "".join(f", admission {k}={v:.3g}" for k, v in self.admission.items() if v)
        graphs = f", graph_tokens={self.graph_tokens}" if self.graph_tokens is not None else ""
        moe = f", moe top-{self.moe['top_k']} of {self.moe['num_experts']}" if self.moe else ""
        return f"CostModel({terms}{adm}{graphs}{moe}; {self.source})"


def _nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||A w - b|| with w >= 0: least squares on an active set, dropping the most
    negative coefficient until none is (Lawson-Hanson's outer loop, enough for 11 columns)."""
    active = list(range(A.shape[1]))
    w = np.zeros(A.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], b, rcond=None)
        if np.all(sol >= 0):
            w[:] = 0
            w[active] = sol
            return w
        active.pop(int(np.argmin(sol)))
    return w
