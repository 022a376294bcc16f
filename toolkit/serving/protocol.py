"""The OpenAI API as data: request and response models for /v1/completions and
/v1/chat/completions, their mapping to SamplingParams, and OpenAI-style errors.

Unknown fields are refused (400, as OpenAI does: "Unrecognized request argument"), so a
typo never silently does nothing. The toolkit's extras travel as vLLM's do, as extra
fields of the body (the openai client's `extra_body=`): top_k, min_p, repetition_penalty,
min_tokens, stop_token_ids, ignore_eos, skip_special_tokens, include_stop_str_in_output,
priority, and `structured_outputs` ({"json": schema} | {"regex": ...} | {"choice": [...]}
| {"json_object": true}; vLLM's `guided_json` / `guided_regex` / `guided_choice` too).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolkit.types import SamplingParams

# per-request size bounds: past them a 400 at once (a 1M-entry logit_bias took 8.5 s to refuse)
MAX_LOGIT_BIAS = 1024        # entries
MAX_STOP = 64                # stop strings; each at most MAX_STOP_CHARS characters
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024


class ProtocolError(ValueError):
    """A request the server refuses: HTTP status, OpenAI error type, the parameter."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Strict(BaseModel):
    # strict types (no "10" for an int, no true for 1, no "yes" for a bool) and no
    # Infinity / NaN: a field's JSON type must be its own
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class StructuredOutputs(_Strict):
    """vLLM's structured-output extension: exactly one of the fields."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _SamplingFields(_Strict):
    """What both endpoints share: OpenAI's sampling fields plus the toolkit's extras."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # extras (vLLM's names)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = 0
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    request_id: str | None = None

    def _structured(self, response_format: "ResponseFormat | None" = None) -> Any:
        """The one grammar this request asks for, or None; two at once is an error."""
        asked: list[tuple[str, Any]] = []
        so = self.structured_outputs
        if so is not None:
            given = [(k, v) for k, v in (("json", so.json_), ("regex", so.regex), ("choice", so.choice),
                                         ("json_object", so.json_object)) if v not in (None, False)]
            if len(given) != 1:
                raise ProtocolError("structured_outputs takes exactly one of json, regex, choice, "
                                    f"json_object; got {[k for k, _ in given] or 'none'}",
                                    param="structured_outputs")
            asked.append(("structured_outputs", given[0]))
        for name, kind in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice")):
            if getattr(self, name) is not None:
                asked.append((name, (kind, getattr(self, name))))
        if response_format is not None and response_format.type != "text":
            if response_format.type == "json_object":
                asked.append(("response_format", ("json_object", True)))
            else:
                if response_format.json_schema is None or response_format.json_schema.schema_ is None:
                    raise ProtocolError("response_format of type json_schema needs json_schema.schema",
                                        param="response_format")
                asked.append(("response_format", ("json", response_format.json_schema.schema_)))
        if not asked:
            return None
        if len(asked) > 1:
            raise ProtocolError(f"one structured output at a time; got {[a for a, _ in asked]}",
                                param=asked[1][0])
        param, (kind, value) = asked[0]
        from toolkit.samplers.grammar.spec import Structured   # the grammar package, only if asked

        try:
            if kind == "json":
                return Structured.json(value)
            if kind == "regex":
                return Structured.regex(value)
            if kind == "choice":
                return Structured.choice(value)
            return Structured.json_object()
        except (ValueError, TypeError) as e:
            raise ProtocolError(f"{param}: {e}", param=param) from None

    def _check_sizes(self, stop: list[str] | None) -> None:
        for name, have, limit in (("logit_bias", self.logit_bias, MAX_LOGIT_BIAS), ("stop", stop, MAX_STOP),
                                  ("stop_token_ids", self.stop_token_ids, MAX_STOP_TOKEN_IDS)):
            if have is not None and len(have) > limit:
                raise ProtocolError(f"{name} has {len(have)} entries; at most {limit} are allowed",
                                    param=name)
        long = [s for s in stop or () if len(s) > MAX_STOP_CHARS]
        if long:
            raise ProtocolError(f"stop strings must be at most {MAX_STOP_CHARS} characters, got one of "
                                f"{len(long[0])}", param="stop")

    def _sampling(self, *, max_tokens: int, logprobs: int | None, structured: Any,
                  default_temperature: float = 1.0,
                  defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        """`defaults`: the server's sampling defaults (--generation-config) for the fields
        the request leaves unset."""
        defaults = defaults or {}
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        self._check_sizes(stop)
        bias = None
        if self.logit_bias:
            try:
                if not all(k.isascii() and k.isdigit() for k in self.logit_bias):   # not " 5", "5_0"
                    raise ValueError
                bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except ValueError:
                raise ProtocolError("logit_bias keys must be token ids (integers as strings), got "
                                    f"{sorted(self.logit_bias)[:3]}", param="logit_bias") from None
            bad = {k: v for k, v in bias.items() if not -100 <= v <= 100}
            if bad:
                raise ProtocolError(f"logit_bias values must be in [-100, 100], got {bad}",
                                    param="logit_bias")
        kw: dict[str, Any] = dict(
            n=self.n, max_tokens=max_tokens, min_tokens=self.min_tokens, stop=stop or None,
            stop_token_ids=self.stop_token_ids, seed=self.seed, logprobs=logprobs,
            ignore_eos=self.ignore_eos, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, logit_bias=bias,
            structured=structured,
            temperature=(defaults.get("temperature", default_temperature) if self.temperature is None
                         else self.temperature))
        for name in ("top_p", "presence_penalty", "frequency_penalty", "top_k", "min_p",
                     "repetition_penalty"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
            elif name in defaults:
                kw[name] = defaults[name]
        try:
            return SamplingParams(**kw)
        except (ValueError, TypeError) as e:
            msg = str(e)
            raise ProtocolError(msg, param=msg.split(" ", 1)[0] if msg else None) from None


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {v}")
        return v

    def prompts(self) -> list[str | list[int]]:
        """One prompt or a batch: text, token ids, or lists of either."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ProtocolError("prompt is an empty list; give text, token ids, or a list of either",
                                param="prompt")
        if isinstance(p[0], int):
            return [list(p)]                   # type: ignore[arg-type]
        return list(p)                         # type: ignore[arg-type]

    def sampling_params(self, max_model_len: int, prompt_len: int,
                        defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        if self.suffix is not None:
            raise ProtocolError("suffix is not supported", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            why = "best_of < n is invalid" if self.best_of < self.n else "best_of > n is not supported"
            raise ProtocolError(f"best_of must equal n ({self.n}) here, got {self.best_of}: {why}",
                                param="best_of")
        if self.echo and self.logprobs is not None:
            raise ProtocolError("echo with logprobs (prompt logprobs) is not supported", param="echo")
        return self._sampling(max_tokens=_max_tokens(self.max_tokens, max_model_len, prompt_len, 16),
                              logprobs=self.logprobs, structured=self._structured(), defaults=defaults)


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")        # name, tool_call_id ... pass to the template

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class JsonSchema(_Strict):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None             # checked in serving/tools/request.py (400 naming the field)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # accepted and ignored (SDKs send them): no stored completions, one service tier
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # extras
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> "ChatCompletionRequest":
        if not self.messages:
            raise ValueError("messages must hold at least one message")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        return self

    def template_messages(self) -> list[dict[str, Any]]:
        """The conversation as the chat template reads it (content parts joined to text)."""
        out = []
        for m in self.messages:
            d = m.model_dump(exclude_none=True)
            d["content"] = m.text()
            out.append(d)
        return out

    def sampling_params(self, max_model_len: int, prompt_len: int,
                        tool_regex: str | None = None,
                        defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        """`tool_regex`: the grammar of a forced tool call (tool_choice required / named)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ProtocolError("top_logprobs needs logprobs=true", param="top_logprobs")
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        structured = self._structured(self.response_format)
        if tool_regex is not None:
            if structured is not None:
                raise ProtocolError("tool_choice 'required' or a named function constrains the output "
                                    "already; drop response_format / structured_outputs",
                                    param="tool_choice")
            from toolkit.samplers.grammar.spec import Structured

            structured = Structured.regex(tool_regex)
        return self._sampling(max_tokens=_max_tokens(limit, max_model_len, prompt_len, None),
                              logprobs=(self.top_logprobs or 0) if self.logprobs else None,
                              structured=structured, defaults=defaults)


def _max_tokens(asked: int | None, max_model_len: int, prompt_len: int, default: int | None) -> int:
    """The request's max_tokens: refused if prompt + max_tokens exceeds the model's length
    (OpenAI's rule); absent (chat) = what is left of the context."""
    room = max_model_len - prompt_len
    if room < 1:
        raise ProtocolError(f"This model's maximum context length is {max_model_len} tokens; the "
                            f"prompt has {prompt_len} tokens, which leaves no room for an output",
                            param="messages" if default is None else "prompt")
    if asked is None:
        return room if default is None else min(default, room)
    if asked < 1:
        raise ProtocolError(f"max_tokens must be at least 1, got {asked}", param="max_tokens")
    if asked > room:
        raise ProtocolError(f"This model's maximum context length is {max_model_len} tokens; you "
                            f"asked for {prompt_len + asked} ({prompt_len} in the prompt, {asked} "
                            "in the completion). Reduce the prompt or max_tokens.", param="max_tokens")
    return asked


# -- responses --
class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, int] | None = None     # {"cached_tokens": prefix-cache hits}


class CompletionLogprobs(BaseModel):
    """The legacy completions logprobs object (parallel lists)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None           # vLLM's field (--reasoning-parser)
    tool_calls: list[dict[str, Any]] | None = None  # [{"id", "type": "function", "function": {...}}]


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "toolkit"
    max_model_len: int | None = None
    root: str | None = None               # vLLM's: an adapter's folder
    parent: str | None = None             # vLLM's: an adapter's base model
    tasks: list[str] | None = None        # "generate", "embed", "classify", "score"


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def finish_reason(reason: str | None) -> str | None:
    """The toolkit's finish reasons as OpenAI's: EOS, stop ids and strings, grammar ends ->
    "stop"; max_tokens -> "length"; an abort stays "abort" (vLLM does the same)."""
    if reason is None:
        return None
    return {"stop": "stop", "grammar": "stop", "length": "length"}.get(reason, reason)
