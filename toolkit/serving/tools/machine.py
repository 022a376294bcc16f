"""`OutputParser`: a completion's text deltas in, content / reasoning / tool-call deltas out.

Streaming is correct by construction: the parser is a character-level state machine
(`_char`), so what it has emitted after any prefix of the text is a function of that prefix
alone, whatever the split into deltas. Text that may still become a tag (`<tool_c`) is
held back until it is one or cannot be; a call's header (id, name) goes out once its name
has been read, its arguments as their characters arrive.

Whitespace rule (shared with the reference twins): content is the text outside blocks with
each segment's trailing whitespace dropped and the leading whitespace of the whole dropped.

A call that turns out malformed after its header went out (the model broke the JSON, or
the output ended inside it) cannot be unsent while streaming: it ends with the argument
text it had. `parse` (the non-streamed path) returns such a call's raw text as content.
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

from toolkit.serving.tools.deltas import Delta, ParsedOutput, ToolCall, arguments_valid
from toolkit.serving.tools.scan import CallTracker, PyListTracker

_WS = " \t\n\r"


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes tool calls (the parts the state machine needs)."""

    name: str
    kind: str = "json"                       # "json" call objects, or a "pythonic" call list
    open_tag: str | None = None              # a call opens with it anywhere in content (Hermes)
    close_tag: str | None = None             # ... and ends with it
    start_tags: tuple[str, ...] = ()         # at the start only: consumed before a call (<|python_tag|>)
    separator: str | None = None             # between calls at the start (Llama 3: ";")
    name_keys: tuple[str, ...] = ("name",)
    arg_keys: tuple[str, ...] = ("arguments", "parameters")


@dataclass(frozen=True)
class ReasoningTags:
    open: str = "<think>"
    close: str = "</think>"
    starts_inside: bool = False              # the prompt opened the block (DeepSeek-R1's template)


@dataclass
class _Call:
    index: int
    id: str
    name: str
    args: str = ""
    raw: str = ""                            # the block's text, for a broken call's fallback
    content_pos: int = 0                     # where in the content the call stood
    done: bool = False


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class OutputParser:
    """One completion's parser. `feed(text)` -> Delta for each text delta, `finish()` ->
    the last Delta; `parse(text)` runs the whole text at once (the non-streamed answer).

    tools: the names a call may have (None: any name); a block naming another is content."""

    def __init__(self, fmt: ToolFormat | None = None, reasoning: ReasoningTags | None = None, *,
                 tools: Collection[str] | None = None,
                 id_factory: Callable[[], str] = new_call_id) -> None:
        self.fmt, self.reasoning, self.tools, self.id_factory = fmt, reasoning, tools, id_factory
        self.mode = "reasoning" if reasoning is not None and reasoning.starts_inside else self._start_mode()
        self.pending = ""            # held text that may still be a tag
        self.ws = ""                 # held content whitespace
        self.content_len = 0         # content characters emitted
        self.block = ""              # the open block's raw text
        self.block_ws = ""           # the content whitespace held when it opened
        self.tracker: CallTracker | PyListTracker | None = None
        self.call: _Call | None = None
        self.calls: list[_Call] = []
        self.out = Delta()
        self._tag_cache: dict[str, tuple[str, ...]] = {}
        self.finished = False

    def _start_mode(self) -> str:
        """Formats whose calls stand only at the start of the output read it in 'start'."""
        return "start" if self.fmt is not None and self.fmt.open_tag is None else "content"

    # -- the public surface --
    def feed(self, text: str) -> Delta:
        if self.finished:
            raise RuntimeError("OutputParser.feed after finish()")
        self.out = Delta()
        i, n = 0, len(text)
        while i < n:
            if self.mode in ("content", "reasoning") and not self.pending:
                # the text before the next character that may start a tag is plain: in bulk
                hits = [k for k in (text.find(t[0], i) for t in self._tags()) if k >= 0]
                j = min(hits, default=n)
                if j > i:
                    (self._reason if self.mode == "reasoning" else self._literal)(text[i:j])
                    i = j
                    continue
            self._char(text[i])
            i += 1
        return self.out

    def finish(self) -> Delta:
        """The end of the output: held text is released, an open block resolved."""
        if self.finished:
            return Delta()
        self.out = Delta()
        held, self.pending = self.pending, ""
        if self.mode == "reasoning":
            self._reason(held)
        elif self.mode in ("call", "py"):
            if self.call is not None:            # committed and never closed: broken
                self.call.raw = self.block
            else:
                self.ws = self.block_ws
                self._literal(self.block)
        else:
            self._literal(held)
        self.finished = True
        return self.out

    def parse(self, text: str) -> ParsedOutput:
        """The whole output at once; a call whose arguments are not a JSON object is content."""
        d = self.feed(text)
        d.extend(self.finish())
        content = d.content
        good: list[ToolCall] = []
        for call in reversed(self.calls):
            if call.done and arguments_valid(call.args):
                good.append(ToolCall(call.id, call.name, call.args))
            else:
                content = content[:call.content_pos] + call.raw + content[call.content_pos:]
        good.reverse()
        return ParsedOutput(content.strip(_WS) or None, d.reasoning or None, good)

    # -- emission --
    def _literal(self, text: str) -> None:
        """Content, under the whitespace rule: whitespace is held until text follows it
        (and dropped before a block, at the end, and at the start of the content)."""
        full = self.ws + text
        core = full.rstrip(_WS)
        self.ws = full[len(core):]
        if not self.content_len:
            core = core.lstrip(_WS)
        self.out.content += core
        self.content_len += len(core)

    def _reason(self, text: str) -> None:
        self.out.reasoning += text

    def _tags(self) -> tuple[str, ...]:
        """The tags that may start in the current mode (they depend on the mode alone)."""
        tags = self._tag_cache.get(self.mode)
        if tags is None:
            tags = self._tag_cache[self.mode] = self._mode_tags()
        return tags

    def _mode_tags(self) -> tuple[str, ...]:
        f, r = self.fmt, self.reasoning
        if self.mode == "reasoning":
            return (r.close, r.open)
        tags: list[str] = []
        if r is not None:
            tags.append(r.open)
        if self.mode == "content" and f is not None and f.open_tag:
            tags.append(f.open_tag)
        if self.mode == "start" and f is not None:
            tags.extend(f.start_tags)
        if self.mode == "after" and f is not None:
            tags.extend(t for t in (f.close_tag, f.separator, f.open_tag) if t)
        return tuple(tags)

    # -- the state machine: one character --
    def _char(self, c: str) -> None:
        if self.mode in ("call", "py"):
            self._block_char(c)
            return
        if self.mode == "start" and not self.pending and c in _WS:
            self._literal(c)                     # held (and dropped) by the whitespace rule
            return
        if self.mode == "start" and not self.pending and c == ("[" if self.fmt.kind == "pythonic" else "{"):
            self._open_block("")
            self._block_char(c)
            return
        if self.mode == "after" and not self.pending and c in _WS:
            return                               # between a call and its close tag
        self.pending += c
        tags = self._tags()
        if self.pending in tags:
            tag, self.pending = self.pending, ""
            self._on_tag(tag)
            return
        if any(t.startswith(self.pending) for t in tags):
            return                               # may still become a tag
        # not a tag: the first held character is text; the rest may start a tag
        held, self.pending = self.pending, ""
        first, rest = held[0], held[1:]
        self._text(first)
        for ch in rest:
            self._char(ch)

    def _text(self, c: str) -> None:
        """A character of plain text in the current (non-block) mode."""
        if self.mode == "reasoning":
            self._reason(c)
            return
        if self.mode in ("start", "after"):
            self.mode = "content"                # the calls' position is over
        self._literal(c)

    def _on_tag(self, tag: str) -> None:
        r, f = self.reasoning, self.fmt
        if r is not None and self.mode == "reasoning":
            if tag == r.close:                   # (a repeated open tag is dropped)
                self.mode = self._start_mode() if not self.content_len and not self.calls else "content"
            return
        if r is not None and tag == r.open:
            self.ws = ""                         # a block ends a content segment
            self.mode = "reasoning"
            return
        if self.mode == "after" and tag != f.open_tag:
            self.mode = "start" if tag == f.separator else "content"
            return
        if self.mode == "start":                 # <|python_tag|>: stay at the start
            return
        self._open_block(tag)                    # Hermes' <tool_call>

    def _open_block(self, opening: str) -> None:
        self.block_ws, self.ws = self.ws, ""     # back if the block turns out not a call
        self.block = opening
        self.call = None
        if self.fmt.kind == "pythonic":
            self.mode, self.tracker = "py", PyListTracker()
        else:
            self.mode = "call"
            self.tracker = CallTracker(self.fmt.name_keys, self.fmt.arg_keys, self.tools)

    def _block_char(self, c: str) -> None:
        tr = self.tracker
        status = tr.feed(c)
        if status == "fail":
            self._block_failed(c)
            return
        self.block += c
        if self.mode == "py":
            if status == "done":
                self._py_done()
            return
        call = self.call
        if call is None and tr.name is not None:                # the header: id and name
            call = self.call = _Call(len(self.calls), self.id_factory(), tr.name,
                                     content_pos=self.content_len)
            self.calls.append(call)
            self.out.add_call(call.index, id=call.id, name=call.name)
        if call is not None:
            args = tr.args_text()
            if len(args) > len(call.args):
                self.out.add_call(call.index, arguments=args[len(call.args):])
                call.args = args
        if status == "done":
            call.done, call.raw = True, self.block
            self.call, self.tracker = None, None
            self.mode = "after" if (self.fmt.close_tag or self.fmt.separator) else "content"

    def _block_failed(self, c: str) -> None:
        if self.call is not None:                # header sent: the call ends broken here
            self.call.raw = self.block
            self.call = None
        else:
            self.ws = self.block_ws
            self._literal(self.block)            # never a call: its text is content
        self.tracker, self.block, self.mode = None, "", "content"
        self._char(c)

    def _py_done(self) -> None:
        calls = parse_pythonic(self.tracker.text, self.tools)
        if calls is None:
            self.ws = self.block_ws
            self._literal(self.block)
        else:
            for name, args in calls:
                call = _Call(len(self.calls), self.id_factory(), name, args, self.block,
                             self.content_len, done=True)
                self.calls.append(call)
                self.out.add_call(call.index, id=call.id, name=name)
                self.out.add_call(call.index, arguments=args)
        self.tracker, self.block, self.mode = None, "", "content"


def parse_pythonic(text: str, tools: Collection[str] | None) -> list[tuple[str, str]] | None:
    """`[f(a=1, b="x"), g()]` -> [(name, arguments JSON)], or None if it is not such a list
    (keyword arguments with literal values only; a name outside `tools` is not a call)."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    out = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
            return None
        if tools is not None and node.func.id not in tools:
            return None
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
            text_args = json.dumps(args, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        if len(args) != len(node.keywords):
            return None                          # **kwargs
        out.append((node.func.id, text_args))
    return out
