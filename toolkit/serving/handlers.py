"""The two OpenAI endpoints as plain async functions over an AsyncEngine: a request model in,
a response model (or a stream of SSE lines) out. No HTTP here, so a custom server can call
them from any framework; `app.py` wires them to FastAPI.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Sequence

from toolkit.entrypoints.async_engine import AsyncEngine
from toolkit.models.chat import apply_chat_template, chat_template_of
from toolkit.serving import protocol as P
from toolkit.serving.tools.output import StreamedChoices, message_fields
from toolkit.serving.tools.request import ToolConfig, ToolPlan, plan_tools
from toolkit.serving.tools.template import render_inputs
from toolkit.types import CompletionOutput, RequestOutput, SamplingParams, _non_defaults

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A validated request, ready to add: one entry per prompt."""

    request_id: str
    model: str
    prompts: list[list[int]]
    prompt_texts: list[str | None]
    params: list[SamplingParams]
    priority: int
    n: int
    client_id: str | None = None  # OpenAI's `user`: the client a fair-share policy counts
    echo: bool = False           # completions: the prompt's text starts each choice
    tools: ToolPlan | None = None  # chat: tools, tool_choice; parses the output
    lora_request: Any = None     # the adapter its `model` names (serving/lora.py), or None


class OpenAIHandlers:
    """Completions and chat completions over one AsyncEngine: `prepare_*` validates a
    request into a `Prepared` (a custom server may change it before running it: its
    params, priority, client), `complete` runs it to one response, `stream` to SSE lines."""

    def __init__(self, engine: AsyncEngine, model_name: str, *, max_model_len: int | None = None,
                 tools: ToolConfig | None = None, sampling_defaults: Mapping[str, Any] | None = None,
                 log_requests: bool = False) -> None:
        """`sampling_defaults`: SamplingParams fields for what a request leaves unset (the
        model's generation_config.json; models/generation_defaults.py). `log_requests`: log
        each prepared request (id, prompt tokens, the sampling fields it sets) at INFO."""
        self.engine, self.model_name = engine, model_name
        self.sampling_defaults = dict(sampling_defaults or {})
        self.log_requests = log_requests
        self.tokenizer = engine.tokenizer
        self.max_model_len = max_model_len or engine.max_model_len
        try:
            template = chat_template_of(self.tokenizer) if self.tokenizer is not None else None
        except ValueError:                         # no chat template: chat is refused anyway
            template = None
        self.tools = (tools or ToolConfig()).resolve(template)   # the format, from the template
        self._max_chars: int | None = None       # text longer than this cannot fit (see _check_chars)
        self.loras: Any = None          # LoRAModules (serving/lora.py): adapters served by name

    # -- preparation (raises ProtocolError for anything the client got wrong) --
    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name and not (self.loras is not None and name in self.loras):
            raise P.ProtocolError(f"The model `{name}` does not exist; this server serves "
                                  f"`{self.model_name}`", status=404, param="model",
                                  code="model_not_found")

    def _check_chars(self, text: str, param: str) -> None:
        """Refuse, before tokenizing it, text that cannot fit max_model_len: no token is longer
        than the vocabulary's longest entry, so such text needs more tokens than the model
        takes (twice that bound: a normalizer may drop characters first)."""
        if self._max_chars is None:
            vocab = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
            longest = max((len(t) for t in vocab), default=64)
            self._max_chars = 2 * max(longest, 16) * self.max_model_len
        if len(text) > self._max_chars:
            raise P.ProtocolError(f"This model's maximum context length is {self.max_model_len} tokens; "
                                  f"the text has {len(text)} characters, more than that many tokens "
                                  f"can hold (at most {self._max_chars} here). Reduce the prompt.",
                                  param=param)

    def _tokenize(self, prompt: str | list[int], param: str) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise P.ProtocolError("this server has no tokenizer; send token ids", param=param)
            self._check_chars(prompt, param)
            return list(self.tokenizer.encode(prompt))
        vocab = self.engine.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise P.ProtocolError(f"token ids must be in [0, {vocab}), got {bad[:3]}", param=param)
        return list(prompt)

    def prepare_completion(self, req: P.CompletionRequest, priority: int | None = None) -> Prepared:
        self.check_model(req.model)
        prompts = req.prompts()
        ids = [self._tokenize(p, "prompt") for p in prompts]
        params = [req.sampling_params(self.max_model_len, len(i), defaults=self.sampling_defaults)
                  for i in ids]
        texts = [p if isinstance(p, str) else (self._decode(p) if req.echo else None) for p in prompts]
        return self._logged(self._with_lora(req.model, Prepared(
            req.request_id or P.new_id("cmpl"), self.model_name, ids, texts, params,
            req.priority if priority is None else priority, req.n, echo=req.echo, client_id=req.user)))

    def prepare_chat(self, req: P.ChatCompletionRequest, priority: int | None = None) -> Prepared:
        self.check_model(req.model)
        if self.tokenizer is None:
            raise P.ProtocolError("chat needs a tokenizer with a chat template; this server has none")
        plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, self.tools)
        for m in req.messages:                     # before the template renders them all
            self._check_chars(m.text(), "messages")
        text = self.render_chat(req, plan)
        self._check_chars(text, "messages")
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        params = req.sampling_params(self.max_model_len, len(ids), tool_regex=plan.regex(),
                                     defaults=self.sampling_defaults)
        return self._logged(self._with_lora(req.model, Prepared(
            req.request_id or P.new_id("chatcmpl"), self.model_name, [ids], [text],
            [params], req.priority if priority is None else priority, req.n, client_id=req.user, tools=plan)))

    def _logged(self, prep: Prepared) -> Prepared:
        if self.log_requests:
            log.info("request %s: %d prompt(s), %s prompt tokens, adapter %s, params %s", prep.request_id,
                     len(prep.prompts), [len(p) for p in prep.prompts],
                     getattr(prep.lora_request, "lora_name", None),
                     {k: v for k, v in _non_defaults(prep.params[0]) if k != "structured"})
        return prep

    def _with_lora(self, name: str | None, prep: Prepared) -> Prepared:
        """A request whose `model` names an adapter runs it (and answers with that name)."""
        lora = self.loras.get(name) if self.loras is not None else None
        if lora is not None:
            prep.model, prep.lora_request = name, lora
        return prep

    def render_chat(self, req: P.ChatCompletionRequest, plan: ToolPlan | None = None) -> str:
        messages = req.template_messages()
        kwargs = dict(req.chat_template_kwargs or {})
        taken = sorted(set(kwargs) & _TEMPLATE_ARGS)
        if taken:
            raise P.ProtocolError(f"chat_template_kwargs may not set {taken}: the server sets "
                                  f"{sorted(_TEMPLATE_ARGS)} (use the request's own fields, e.g. "
                                  "add_generation_prompt)", param="chat_template_kwargs")
        if plan is not None:                       # tools in the prompt, tool calls in the history
            messages, extra = render_inputs(messages, plan)
            kwargs = {**extra, **kwargs}
        try:
            if req.continue_final_message:
                if messages[-1]["role"] != "assistant":
                    raise P.ProtocolError("continue_final_message needs a final assistant message",
                                          param="messages")
                text = apply_chat_template(self.tokenizer, messages, add_generation_prompt=False, **kwargs)
                end = text.rfind(messages[-1]["content"])
                return text if end < 0 else text[: end + len(messages[-1]["content"])]
            return apply_chat_template(self.tokenizer, messages,
                                       add_generation_prompt=req.add_generation_prompt, **kwargs)
        except P.ProtocolError:
            raise
        except Exception as e:                     # the template's own raise_exception, bad kwargs
            raise P.ProtocolError(f"the chat template could not render these messages: {e}",
                                  param="messages") from None

    # -- running --
    async def add(self, prep: Prepared) -> list[Any]:
        """Add every prompt of a request; if one is refused, the ones added are aborted."""
        streams = []
        try:
            for i, (ids, sp) in enumerate(zip(prep.prompts, prep.params)):
                rid = prep.request_id if len(prep.prompts) == 1 else f"{prep.request_id}-{i}"
                fields = {"priority": prep.priority}
                if prep.client_id is not None:
                    fields["client_id"] = prep.client_id
                if prep.lora_request is not None:
                    fields["lora_request"] = prep.lora_request
                streams.append(await self.engine.add_async(ids, sp, request_id=rid, **fields))
        except BaseException:
            for s in streams:
                self.engine.abort(s.request_id)
            raise
        return streams

    async def complete(self, prep: Prepared, chat: bool) -> P.CompletionResponse | P.ChatCompletionResponse:
        """Run to the end; the whole response."""
        finals = await asyncio.gather(*(_final(s) for s in await self.add(prep)))
        usage = _usage(finals)
        if chat:
            choices = []
            for o in finals:
                for c in o.outputs:
                    fields, reason = ({"content": c.text}, P.finish_reason(c.finish_reason))
                    if prep.tools is not None and prep.tools.parses:
                        fields, reason = message_fields(prep.tools, c.text, reason)
                    choices.append(P.ChatChoice(
                        index=c.index, message=P.ChatResponseMessage(**fields),
                        logprobs=self._chat_logprobs(c, prep.params[0].logprobs),
                        finish_reason=reason, stop_reason=c.stop_reason))
            return P.ChatCompletionResponse(id=prep.request_id, created=P.now(), model=prep.model,
                                            choices=choices, usage=usage)
        choices = []
        for i, o in enumerate(finals):
            echo = (prep.prompt_texts[i] or "") if prep.echo else ""
            for c in o.outputs:
                choices.append(P.CompletionChoice(
                    index=i * prep.n + c.index, text=echo + c.text,
                    logprobs=self._completion_logprobs(c, 0), finish_reason=P.finish_reason(c.finish_reason),
                    stop_reason=c.stop_reason))
        return P.CompletionResponse(id=prep.request_id, created=P.now(), model=prep.model,
                                    choices=choices, usage=usage)

    async def stream(self, prep: Prepared, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        """Server-sent events: one chunk per delta, then usage (if asked) and [DONE]."""
        created = P.now()
        streams = await self.add(prep)
        offsets: dict[int, int] = {}                 # choice index -> text characters sent
        tokens: dict[int, int] = {}                  # choice index -> output tokens so far
        parsed = StreamedChoices(prep.tools) if chat and prep.tools is not None and prep.tools.parses else None
        try:
            if chat:                                 # the role comes first, as OpenAI sends it
                for i in range(len(streams) * prep.n):
                    yield _sse(P.ChatCompletionChunk(
                        id=prep.request_id, created=created, model=prep.model,
                        choices=[P.ChatChunkChoice(index=i, delta=P.ChatDelta(role="assistant", content=""))]))
            async for i, out in _merged(streams):
                for c in out.outputs:
                    index = i * prep.n + c.index
                    tokens[index] = tokens.get(index, 0) + len(c.token_ids)
                    reason = P.finish_reason(c.finish_reason)
                    # chunks as plain dicts: a step at batch 256 makes 256 of them, and a
                    # pydantic model for each costs the server's GIL time every step
                    if chat:
                        lp = self._chat_logprobs(c, prep.params[0].logprobs)
                        delta: dict[str, Any] | None = {"content": c.text}
                        if parsed is not None:         # tool calls, reasoning: held tags
                            delta, reason = parsed.delta(index, c.text, reason)
                            if delta is None and reason is None and lp is None:
                                continue
                        choice = {"index": index, "delta": delta or {},
                                  "logprobs": lp and lp.model_dump(exclude_none=True), "finish_reason": reason}
                        yield _sse_dict({"id": prep.request_id, "object": "chat.completion.chunk",
                                         "created": created, "model": prep.model, "choices": [choice]})
                    else:
                        text = c.text
                        if index not in offsets and prep.echo:
                            text = (prep.prompt_texts[i] or "") + text
                        lp = self._completion_logprobs(c, offsets.get(index, 0))
                        offsets[index] = offsets.get(index, 0) + len(text)
                        choice = {"index": index, "text": text, "logprobs": lp and lp.model_dump(),
                                  "finish_reason": reason}
                        yield _sse_dict({"id": prep.request_id, "object": "text_completion",
                                         "created": created, "model": prep.model, "choices": [choice]})
            if include_usage:
                n_prompt = sum(len(p) for p in prep.prompts)
                n_out = sum(tokens.values())
                usage = P.UsageInfo(prompt_tokens=n_prompt, completion_tokens=n_out,
                                    total_tokens=n_prompt + n_out)
                cls = P.ChatCompletionChunk if chat else P.CompletionResponse
                yield _sse(cls(id=prep.request_id, created=created, model=prep.model, choices=[],
                               usage=usage))
        except Exception as e:                       # failed inside the engine: any error ends the
            # stream with an error event, then [DONE] (a KeyError from a user's part included)
            msg = str(e) if isinstance(e, (ValueError, RuntimeError)) else f"{type(e).__name__}: {e}"
            yield "data: " + json.dumps(P.error_body(msg, type="server_error")) + "\n\n"
        finally:                                     # closed early (client gone): free its blocks
            for s in streams:
                self.engine.abort(s.request_id)      # a finished request's id is ignored
        yield "data: [DONE]\n\n"

    # -- logprobs in OpenAI's two shapes --
    def _token(self, tid: int) -> str:
        return self._decode([tid])

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids)) if self.tokenizer is not None else " ".join(map(str, ids))

    def _chat_logprobs(self, c: CompletionOutput, k: int | None) -> P.ChatLogprobs | None:
        """Each token's logprob and the k most likely tokens at its position (the engine's
        dict holds the sampled token and the top k)."""
        if c.logprobs is None or k is None:
            return None
        content = []
        for tid, lps in zip(c.token_ids, c.logprobs):
            tok = self._token(tid)
            top = sorted(lps.items(), key=lambda kv: (-kv[1], kv[0]))
            content.append(P.TokenLogprob(
                token=tok, logprob=_finite(lps.get(tid)), bytes=list(tok.encode()),
                top_logprobs=[P.TopLogprob(token=self._token(t), logprob=_finite(v),
                                           bytes=list(self._token(t).encode())) for t, v in top[:k]]))
        return P.ChatLogprobs(content=content)

    def _completion_logprobs(self, c: CompletionOutput, offset: int) -> P.CompletionLogprobs | None:
        if c.logprobs is None:
            return None
        out = P.CompletionLogprobs()
        for tid, lps in zip(c.token_ids, c.logprobs):
            tok = self._token(tid)
            out.tokens.append(tok)
            out.token_logprobs.append(_finite(lps.get(tid)))
            out.top_logprobs.append({self._token(t): _finite(v) for t, v in lps.items()})
            out.text_offset.append(offset)
            offset += len(tok)
        return out


# what the server passes to the chat template itself (chat_template_kwargs may not repeat them)
_TEMPLATE_ARGS = frozenset({"messages", "add_generation_prompt", "tokenizer"})


def _finite(v: float | None) -> float:
    """JSON has no -inf: a token the model gives probability 0 gets OpenAI's floor value."""
    if v is None or v != v:
        return -9999.0
    return max(float(v), -9999.0)


def _sse(model: Any) -> str:
    return "data: " + model.model_dump_json(exclude_none=True) + "\n\n"


def _sse_dict(d: dict[str, Any]) -> str:
    return "data: " + json.dumps(d, ensure_ascii=False, separators=(",", ":")) + "\n\n"


async def _final(stream) -> RequestOutput:
    last = None
    async for out in stream.iterate("final"):
        last = out
    if last is not None and last.finish_reason == "rejected":
        raise ValueError(f"request rejected: {last.outputs[0].stop_reason if last.outputs else ''}")
    return last


async def _merged(streams: list) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The deltas of several streams as they come, tagged with the stream's position."""
    if len(streams) == 1:
        async for out in streams[0].iterate("delta"):
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s) -> None:
        try:
            async for out in s.iterate("delta"):
                await queue.put((i, out, None))
        except Exception as e:                       # handed to the reader
            await queue.put((i, None, e))
        await queue.put((i, None, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        done = 0
        while done < len(tasks):
            i, out, err = await queue.get()
            if err is not None:
                raise err
            if out is None:
                done += 1
            else:
                yield i, out
    finally:
        for t in tasks:                             # cancelled: their streams abort
            t.cancel()


def _usage(finals: list[RequestOutput]) -> P.UsageInfo:
    n_prompt = sum(len(o.prompt_token_ids) for o in finals)
    n_out = sum(len(c.token_ids) for o in finals for c in o.outputs)
    cached = sum(o.metrics.num_cached_tokens for o in finals if o.metrics is not None)
    return P.UsageInfo(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out,
                       prompt_tokens_details={"cached_tokens": cached})
