"""Shared value types of the pipeline: requests, sampling parameters, scheduler output.

Everything here is plain data. The scheduler, the runner and the samplers all read
these; none of them holds hidden state in them beyond what a field says.
"""

from __future__ import annotations

import enum
import math
import numbers
import time
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence


def _check(cond: bool, name: str, valid: str, value: Any) -> None:
    if not cond:
        raise ValueError(f"{name} must be {valid}, got {value!r}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _real(name: str, value: Any, finite: bool = False, float32: bool = False) -> float:
    """value as a float, or a TypeError (not a number) / ValueError (NaN; inf when finite;
    beyond float32's range when float32: the sampler's values are float32) naming the field."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if float32 and not abs(value) <= FLOAT32_MAX:
        raise ValueError(f"{name} must be a finite float32 number (|x| <= {FLOAT32_MAX:.4g}), got {value}")
    return value


def _int_list(name: str, value: Any) -> None:
    """A list (or tuple) of ints, or a TypeError naming the field."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of token ids, got {type(value).__name__}")


# min_p travels to the kernels as float32: a positive value below float32's smallest normal
# number would round to 0 or a denormal there, so it counts as off everywhere (reference too)
MIN_P_FLOOR = 1.1754943508222875e-38

# temperatures below this are greedy (vLLM's _SAMPLING_EPS): logits / T would overflow float32
# (1e-45 turned every logit into +-inf and NaN: token 0 forever, masks ignored)
SAMPLING_EPS = 1e-5
# the largest finite float32: every float parameter travels to the sampler as float32, where a
# larger value is inf (repetition_penalty=1e308 divided every logit to 0)
FLOAT32_MAX = 3.4028234663852886e38

PLACEHOLDER = -1   # a sampled token not yet on the host (async scheduling); never a real id


@dataclass
class SamplingParams:
    """Per-request sampling parameters, validated on creation (vLLM's names and meanings).

    The order in which the sampler applies them is fixed: penalties -> logit_bias /
    allowed_token_ids / bad_words -> temperature -> min_p -> top_k -> top_p -> sample.
    """

    n: int = 1                                   # parallel samples of one prompt (the engine
                                                 # takes at most max_num_seqs)
    temperature: float = 1.0                     # 0 (or < SAMPLING_EPS = 1e-5) = greedy (argmax,
                                                 # lowest id on ties)
    top_k: int = 0                               # 0 or -1 = off
    top_p: float = 1.0                           # (0, 1]; 1 = off
    min_p: float = 0.0                           # [0, 1]; 0 (or < 1.2e-38) = off
    presence_penalty: float = 0.0                # [-2, 2]
    frequency_penalty: float = 0.0               # [-2, 2]
    repetition_penalty: float = 1.0              # > 0; 1 = off (prompt and output tokens)
    logit_bias: dict[int, float] | None = None   # token id -> added to the logit
    allowed_token_ids: list[int] | None = None   # only these may be sampled
    bad_words: list[list[int] | str] | None = None  # token-id sequences never to complete;
                                                 # words as text are tokenized by the engine
    seed: int | None = None                      # per-request generator, batch-independent
    logprobs: int | None = None                  # top-N logprobs (+ the sampled token)
    prompt_logprobs: int | None = None           # top-N logprobs of every prompt token
    max_tokens: int = 16
    min_tokens: int = 0                          # EOS / stop ids banned before this many
    stop: list[str] | None = None                # stop strings (removed from the text)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: Any = None                       # a grammar spec (see samplers.grammar)
    best_of: int | None = None                   # sample this many, return the n most likely
    # vLLM's spellings of `structured` (GuidedDecodingParams / StructuredOutputsParams or a
    # dict): read into `structured`, then set back to None
    guided_decoding: Any = None
    structured_outputs: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "SamplingParams":
        # an unknown keyword names the valid ones (the dataclass __init__ would only say
        # "unexpected keyword argument")
        unknown = [k for k in kwargs if k not in _SAMPLING_FIELDS]
        if unknown:
            import difflib

            hints = [f"{k!r}: did you mean {m[0]!r}?" for k in unknown
                     if (m := difflib.get_close_matches(k, _SAMPLING_FIELDS, n=1))]
            raise TypeError(f"SamplingParams got unknown keyword(s) {unknown}"
                            + (f" ({'; '.join(hints)})" if hints else "")
                            + f"; valid keywords: {sorted(_SAMPLING_FIELDS)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        self._read_vllm_structured()
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            setattr(self, name, _real(name, getattr(self, name), finite=True, float32=True))
        for name in ("n", "top_k", "max_tokens", "min_tokens"):
            v = getattr(self, name)
            if not _is_int(v):
                raise TypeError(f"{name} must be an integer, got {type(v).__name__} {v!r}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.structured is not None:
            # checked now, not when generate compiles it (the import is deferred: plain data
            # otherwise needs no grammar package)
            from toolkit.samplers.grammar.spec import Structured

            self.structured = Structured.coerce(self.structured)
            self.structured.validate()
        _check(_is_int(self.n) and self.n >= 1, "n", "an integer >= 1", self.n)
        _check(self.temperature >= 0.0, "temperature", ">= 0 (0 = greedy)", self.temperature)
        if self.temperature < SAMPLING_EPS:
            self.temperature = 0.0               # greedy, as vLLM does below _SAMPLING_EPS
        _check(_is_int(self.top_k) and self.top_k >= -1, "top_k", "-1, 0 (off) or a positive integer", self.top_k)
        _check(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]", self.top_p)
        _check(0.0 <= self.min_p <= 1.0, "min_p", "in [0, 1]", self.min_p)
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "in [-2, 2]", self.presence_penalty)
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "in [-2, 2]", self.frequency_penalty)
        _check(self.repetition_penalty > 0.0, "repetition_penalty", "> 0", self.repetition_penalty)
        _check(_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "an integer >= 1", self.max_tokens)
        _check(_is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
               "min_tokens", f"an integer in [0, max_tokens={self.max_tokens}]", self.min_tokens)
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            _check(v is None or (_is_int(v) and v >= 0), name, "None or an integer >= 0", v)
        _check(self.seed is None or _is_int(self.seed), "seed", "None or an integer", self.seed)
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise TypeError(f"logit_bias must be a dict of token id -> bias, got "
                                f"{type(self.logit_bias).__name__}")
            _check(all(_is_int(k) and k >= 0 for k in self.logit_bias), "logit_bias",
                   "a dict with non-negative integer token ids as keys", self.logit_bias)
            self.logit_bias = {int(k): _real(f"logit_bias[{k}]", v, finite=True, float32=True) for k, v in self.logit_bias.items()}
        for name in ("allowed_token_ids", "stop_token_ids"):
            if getattr(self, name) is not None:
                _int_list(name, getattr(self, name))
        if self.bad_words is not None:
            _int_list("bad_words", self.bad_words)
            for w in self.bad_words:
                if not isinstance(w, str):
                    _int_list("bad_words[i]", w)
        if self.allowed_token_ids is not None:
            _check(len(self.allowed_token_ids) > 0 and all(_is_int(t) and t >= 0 for t in self.allowed_token_ids),
                   "allowed_token_ids", "a non-empty list of non-negative token ids", self.allowed_token_ids)
        if self.bad_words is not None:
            _check(all(len(w) > 0 and (isinstance(w, str) or all(_is_int(t) and t >= 0 for t in w))
                       for w in self.bad_words),
                   "bad_words", "a list of non-empty words (text) or token-id lists", self.bad_words)
        _check(self.best_of is None or (_is_int(self.best_of) and self.best_of >= self.n),
               "best_of", f"None or an integer >= n={self.n}", self.best_of)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            if not isinstance(self.stop, (list, tuple)):
                raise TypeError(f"stop must be a string or a list of strings, got {type(self.stop).__name__}")
            self.stop = list(self.stop)
            _check(all(isinstance(s, str) and s for s in self.stop), "stop", "a list of non-empty strings", self.stop)
        if self.stop_token_ids is not None:
            _check(all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
                   "a list of non-negative token ids", self.stop_token_ids)

    def _read_vllm_structured(self) -> None:
        given = [k for k in ("structured", "guided_decoding", "structured_outputs")
                 if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of structured, guided_decoding, structured_outputs; got {given}")
        for name in ("guided_decoding", "structured_outputs"):
            if getattr(self, name) is not None:
                from toolkit.samplers.grammar.guided import from_guided

                self.structured = from_guided(getattr(self, name), name)
                setattr(self, name, None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """Whether a repetition, presence or frequency penalty is on (they read the token lists)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def has_text_bad_words(self) -> bool:
        """Whether some bad word is text (the engine tokenizes it when the request is added)."""
        return any(isinstance(w, str) for w in self.bad_words or ())

    def __repr__(self) -> str:
        """Only the fields that differ from the defaults: SamplingParams(temperature=0, max_tokens=8)."""
        return f"SamplingParams({', '.join(f'{k}={v!r}' for k, v in _non_defaults(self))})"

    def _repr_html_(self) -> str:
        from toolkit.display import html_table

        rows = {k: repr(v) for k, v in _non_defaults(self)}
        return html_table("SamplingParams", rows or {"(all defaults)": ""}, kind="sampling-params")


_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


@dataclass
class BeamSearchParams:
    """vLLM's beam-search parameters: `llm.beam_search(prompts, BeamSearchParams(beam_width=4,
    max_tokens=32))`. Beams are ranked by cum_logprob / generated_len ** length_penalty."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0                     # only 0 (deterministic beams) is supported
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False     # accepted for vLLM; beams stop on EOS only

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            v = getattr(self, name)
            if not _is_int(v):
                raise TypeError(f"{name} must be an integer, got {type(v).__name__} {v!r}")
            _check(v >= 1, name, "an integer >= 1", v)
        self.length_penalty = _real("length_penalty", self.length_penalty, finite=True)
        _check(_real("temperature", self.temperature) == 0.0, "temperature",
               "0 (beam search here is deterministic)", self.temperature)
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def __repr__(self) -> str:
        return f"BeamSearchParams({', '.join(f'{k}={v!r}' for k, v in _non_defaults(self))})"


def _non_defaults(sp: Any) -> list[tuple[str, Any]]:
    """(name, value) of the dataclass fields of `sp` whose value is not the default."""
    import dataclasses

    out = []
    for f in dataclasses.fields(sp):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        v = getattr(sp, f.name)
        if f.repr and not (v is default or v == default):
            out.append((f.name, v))
    return out


class RequestFault(RuntimeError):
    """A step failed because of these requests alone (a policy hook raised for one of them):
    the engine's loops end only them, with this error, and go on serving the others.
    `request_ids` are scheduler (sequence) ids."""

    def __init__(self, request_ids: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.request_ids = list(request_ids)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"      # EOS or a stop token / string
    FINISHED_LENGTH = "finished_length"        # max_tokens or max_model_len
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_IGNORED = "finished_ignored"      # rejected: can never fit
    FINISHED_GRAMMAR = "finished_grammar"      # no token can continue the grammar
    # [kv_transfer] blocks allocated, its KV loading from a connector (toolkit/kv_transfer/)
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_IGNORED: "rejected",
            RequestStatus.FINISHED_GRAMMAR: "grammar",
        }.get(self)


@dataclass(eq=False)
class Request:
    """One sequence as the scheduler sees it: token ids, never text.

    Phase-free: the scheduler grants tokens so `num_computed_tokens` catches up with
    `num_tokens`; prefill, chunked prefill, decode and recompute after preemption are
    all that one rule.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    eos_token_id: int | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0                     # lower value = served first (vLLM's convention)
    cache_salt: int = 0                   # extra key of the prefix-cache hash (adapter, tenant)
    max_model_len: int | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0            # prefix-cache hit at the last admission
    num_preemptions: int = 0
    spec_token_ids: list[int] = field(default_factory=list)   # draft tokens to verify this step
    spec_token_probs: Any = None          # float32 [len(spec_token_ids), V] draft distribution, or None (one-hot)
    stop_reason: int | str | None = None
    # what scheduling policies read (toolkit/schedulers/policies.py); None = not given
    client_id: str | None = None          # tenant / user, for fair share across clients (VTC)
    deadline: float | None = None         # seconds after arrival_time to finish by (EDF, goodput)
    expected_output_len: int | None = None  # an estimate of the output tokens (SJF by output)
    lora_request: Any = None              # the LoRARequest it runs with (None: the base model)
    # the job class: a pooling request (toolkit.pooling.PoolingParams) is prefill-only; it
    # finishes when its prompt is computed, with no token sampled
    pooling_params: Any = None
    prefill_whole: bool = False           # the prompt runs in one step, never chunked (bidirectional attention)
    _prompt_array: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # checked here, not where they are first used: a bad value queued would fail every
        # later step's sort (the queue poisoned), not only this request
        if not isinstance(self.request_id, str):
            raise TypeError(f"request_id must be a string, got {type(self.request_id).__name__}")
        if not _is_int(self.priority):
            raise TypeError(f"priority must be an integer, got {type(self.priority).__name__} {self.priority!r}")
        if self.client_id is not None and not isinstance(self.client_id, str):
            raise TypeError(f"client_id must be a string or None, got {type(self.client_id).__name__}")
        if self.deadline is not None:
            self.deadline = _real("deadline", self.deadline, finite=True)
            _check(self.deadline > 0, "deadline", "None or seconds > 0 after arrival_time", self.deadline)
        if self.expected_output_len is not None:
            _check(_is_int(self.expected_output_len) and self.expected_output_len >= 0,
                   "expected_output_len", "None or an integer >= 0", self.expected_output_len)
        self.arrival_time = _real("arrival_time", self.arrival_time)
        self.prompt_token_ids = token_id_list(self.prompt_token_ids, "prompt_token_ids")
        _check(len(self.prompt_token_ids) > 0, "prompt_token_ids", "non-empty", self.prompt_token_ids)

    @property
    def prompt_array(self) -> Any:
        """The prompt as int64 numpy [P], made once: the sampler's per-step metadata copies
        it for repetition penalties instead of converting the list again each step."""
        if self._prompt_array is None:
            import numpy as np

            self._prompt_array = np.asarray(self.prompt_token_ids, dtype=np.int64)
        return self._prompt_array

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_pooling(self) -> bool:
        """A prefill-only pooling request (embed / classify / score), not a generation."""
        return self.pooling_params is not None

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_slice(self, start: int, stop: int) -> list[int]:
        """Token ids at positions [start, stop), draft tokens included past num_tokens."""
        p = len(self.prompt_token_ids)
        out: list[int] = []
        if start < p:
            out.extend(self.prompt_token_ids[start:min(stop, p)])
        if stop > p:
            toks = self.output_token_ids + self.spec_token_ids
            out.extend(toks[max(start - p, 0):stop - p])
        return out

    @property
    def is_finished(self) -> bool:
        return self.status.finished


@dataclass
class ScheduledRequest:
    """What one request runs this step: tokens [start, start + num_new_tokens)."""

    request: Request
    start: int                     # num_computed_tokens when scheduled (= first position)
    num_new_tokens: int
    block_ids: list[int]           # the whole block table after this step's allocation
    num_spec_tokens: int = 0       # of the new tokens, how many are drafts to verify

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def end(self) -> int:
        return self.start + self.num_new_tokens

    @property
    def samples(self) -> bool:
        """Whether this step produces a token: the chunk reaches the end of the sequence (a
        pooling request never samples: its last chunk finishes it)."""
        return self.end >= self.request.num_tokens and self.request.pooling_params is None


@dataclass
class SchedulerOutput:
    """One step's plan. `scheduled` keeps the batch order the runner flattens in."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)   # finished since the last step
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    # host tier (blocks/host_tier.py): (device block, host slot) copied to the host, and
    # (host slot, device block) copied back; the runner runs swap-outs, then swap-ins, then
    # blocks_to_copy, in stream order before the step's forward
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # multi-LoRA: {adapter id: device slot} of the scheduled requests' adapters (the scheduler's
    # AdapterPool decides; the runner loads an adapter into a slot that does not hold it yet)
    lora_slots: dict[int, int] = field(default_factory=dict)
    # [kv_transfer] the connector's plan for the worker side (KVConnectorMetadata), or None
    kv_connector_metadata: Any = None

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.request_id: s.num_new_tokens for s in self.scheduled}

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_spec_drafted: int = 0             # draft tokens verified for this request
    num_spec_accepted: int = 0            # of which accepted
    num_cached_tokens: int = 0            # prompt tokens found in the prefix cache at first admission

    @property
    def spec_acceptance_rate(self) -> float | None:
        return self.num_spec_accepted / self.num_spec_drafted if self.num_spec_drafted else None

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One of a request's n completions, as it stands after a step. `text` only ever grows
    from one step to the next (a tail that could still become a stop string is held back
    until it is decided); `new_token_ids` are the tokens this completion gained this step."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, Any]] | None = None
    cumulative_logprob: float | None = None
    new_token_ids: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepResult:
    """Everything one step produced, keyed by request id; the one object both the scheduler
    (tokens, accepted drafts) and the output processor (logprobs, grammar ends) read.

    A request that verified k draft tokens emits 1 to k + 1 tokens: the accepted drafts,
    then one sampled (bonus or recovered) token; its number of accepted drafts is
    len(tokens) - 1.
    """

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    num_draft_tokens: dict[str, int] = field(default_factory=dict)     # drafts verified, per request
    logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)   # one dict per emitted token
    # (first position p, [{token at p + 1 and its top-N: logprob}, ...]) for this step's prompt chunk
    prompt_logprobs: dict[str, tuple[int, list[dict[int, float]]]] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)   # finish reasons found outside the scheduler
    pooled: dict[str, Any] = field(default_factory=dict)     # pooling requests that finished: float32 tensor
    # [kv_transfer] transfers the connector finished (kv_transfer.base.KVConnectorOutput), or None
    kv_connector_output: Any = None

    @classmethod
    def of(cls, result: "StepResult | Mapping[str, Sequence[int]]") -> "StepResult":
        """A StepResult from itself or from a plain {request id: tokens} mapping."""
        if isinstance(result, StepResult):
            return result
        if not isinstance(result, Mapping):
            raise TypeError(f"update() takes a StepResult or a mapping of request id -> token ids, "
                            f"got {type(result).__name__}")
        return cls(sampled_token_ids={k: list(v) for k, v in result.items()})

    def num_accepted(self, request_id: str) -> int:
        if request_id not in self.num_draft_tokens:
            return 0
        return max(len(self.sampled_token_ids.get(request_id, ())) - 1, 0)


@dataclass
class RequestOutput:
    """What a step reports for one request: new tokens, and whether it finished.

    The scheduler fills `new_token_ids` and `finished`; the engine's output processor
    adds the text and metrics.
    """

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    outputs: list[CompletionOutput] = field(default_factory=list)
    metrics: RequestMetrics | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None   # [None, {token: logprob}, ...]
    lora_request: Any = None              # the adapter it ran with (vLLM's field); None: the base model

    @property
    def text(self) -> str:
        return self.outputs[0].text if self.outputs else ""

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids if self.outputs else []

    @property
    def time_to_first_token(self) -> float | None:
        return self.metrics.time_to_first_token if self.metrics else None

    @property
    def time_per_output_token(self) -> float | None:
        m = self.metrics
        if m is None or m.first_token_time is None or m.finished_time is None:
            return None
        n = len(self.token_ids)
        return (m.finished_time - m.first_token_time) / (n - 1) if n > 1 else 0.0


def token_id_list(ids: Any, name: str = "prompt") -> list[int]:
    """A prompt of token ids as a list of Python ints: a list or tuple of ints, or an integer
    numpy array / torch tensor of one dimension. Floats, booleans, strings and None are
    refused with a TypeError (a float id would otherwise be truncated silently)."""
    if hasattr(ids, "tolist") and hasattr(ids, "dtype"):      # numpy array or torch tensor
        kind = str(ids.dtype)
        if "int" not in kind or getattr(ids, "ndim", 1) != 1:
            raise TypeError(f"{name} as an array must hold integers in one dimension, "
                            f"got dtype {kind} with shape {tuple(ids.shape)}")
        return ids.tolist()                 # Python ints, at C speed (an integer dtype)
    if type(ids) in (list, tuple) and set(map(type, ids)) <= {int}:
        # the common case at C speed: a per-token ABC isinstance cost ~1-2 us a token on the
        # host, idling the GPU while generate() queued a large batch (bool is not type int)
        return list(ids)
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"{name} must be a list of token ids (ints), got {type(ids).__name__}")
    # numpy integer scalars are numbers.Integral; bool is refused (it is an int to Python)
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)), _NO_BAD)
    if bad is not _NO_BAD:
        raise TypeError(f"{name} must hold integer token ids, got {type(bad).__name__} {bad!r}")
    return [int(t) for t in ids]


_NO_BAD = object()


def as_token_lists(x: Sequence[int] | Sequence[Sequence[int]]) -> list[list[int]]:
    if len(x) and isinstance(x[0], int):
        return [list(x)]  # type: ignore[arg-type]
    return [list(t) for t in x]  # type: ignore[union-attr]


__all__ = [
    "SamplingParams", "BeamSearchParams", "RequestStatus", "Request", "ScheduledRequest", "SchedulerOutput",
    "RequestMetrics", "CompletionOutput", "RequestOutput", "StepResult", "Mapping",
]
