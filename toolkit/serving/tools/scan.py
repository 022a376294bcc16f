"""Character-level scanners for tool-call blocks, O(1) a character and fed one character at
a time, so what they decide depends only on the text, never on how it was split into stream
deltas.

`JsonScanner` validates one JSON value as it arrives and says, for the top-level object,
where each member's key and value begin and end. `CallTracker` reads a call object on it
(`{"name": ..., "arguments": {...}}`): the name once its string closes, the arguments' raw
text as far as it has arrived. `PyListTracker` finds the end of a pythonic call list
(`[f(a=1), g()]`) by brackets and string quotes; the list itself is parsed with `ast`.
"""

from __future__ import annotations

import json
from collections.abc import Collection

_WS = " \t\n\r"
# what the scanner expects next (outside a string, number or literal)
VALUE, KEY_OR_END, KEY, COLON, OBJ_NEXT, ARR_VALUE_OR_END, ARR_NEXT, DONE = range(8)
_HEX = set("0123456789abcdefABCDEF")
# number states: the terminal ones may end the number
N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP = range(8)
_N_TERMINAL = {N_ZERO, N_INT, N_FRAC, N_EXP}


class JsonScanner:
    """Validates one JSON value, a character at a time. `feed` returns False at the first
    character that cannot continue a valid JSON text (the scanner is then `failed`).

    For the top-level object it records `members`: [key_span, value_start, value_end]: the
    offsets (in characters fed) of each member's raw value text; value_end is None while
    the value is still arriving."""

    def __init__(self) -> None:
        self.pos = 0                    # characters fed
        self.stack: list[str] = []      # "o" | "a": the open containers
        self.expect = VALUE
        self.lex: str | None = None     # "s" string, "n" number, "l" literal
        self.is_key = False             # the open string is an object key
        self.esc = 0                    # in a string: 0, 1 after "\", 2..5 hex digits left + 1
        self.num = N_MINUS
        self.lit = ""                   # a literal's characters still expected
        self.failed = False
        self.key_start = 0
        self.key_span = (0, 0)          # the last key's raw text, quotes included
        self.members: list[list] = []   # top-level object: [key_span, value_start, value_end | None]

    @property
    def done(self) -> bool:
        return self.expect == DONE and self.lex is None

    def feed(self, c: str) -> bool:
        if self.failed:
            return False
        ok = self._feed(c)
        self.pos += 1
        if not ok:
            self.failed = True
        return ok

    # -- the automaton --
    def _feed(self, c: str) -> bool:
        if self.lex == "s":
            return self._string(c)
        if self.lex == "l":
            if c != self.lit[0]:
                return False
            self.lit = self.lit[1:]
            if not self.lit:
                self.lex = None
                self._value_done(self.pos + 1)
            return True
        if self.lex == "n":
            if self._number(c):
                return True
            if self.num not in _N_TERMINAL:
                return False
            self.lex = None
            self._value_done(self.pos)            # the number ended before this character
        return self._structure(c)

    def _structure(self, c: str) -> bool:
        if c in _WS:
            return True
        e = self.expect
        if e in (VALUE, ARR_VALUE_OR_END):
            if e == ARR_VALUE_OR_END and c == "]":
                return self._close("a")
            return self._value_start(c)
        if e in (KEY_OR_END, KEY):
            if e == KEY_OR_END and c == "}":
                return self._close("o")
            if c != '"':
                return False
            self.lex, self.is_key, self.esc = "s", True, 0
            self.key_start = self.pos
            return True
        if e == COLON:
            if c != ":":
                return False
            self.expect = VALUE
            return True
        if e == OBJ_NEXT:
            if c == ",":
                self.expect = KEY
                return True
            return c == "}" and self._close("o")
        if e == ARR_NEXT:
            if c == ",":
                self.expect = VALUE
                return True
            return c == "]" and self._close("a")
        return False                              # DONE: nothing may follow but whitespace

    def _value_start(self, c: str) -> bool:
        if len(self.stack) == 1 and self.stack[0] == "o":
            self.members.append([self.key_span, self.pos, None])
        if c == "{":
            self.stack.append("o")
            self.expect = KEY_OR_END
        elif c == "[":
            self.stack.append("a")
            self.expect = ARR_VALUE_OR_END
        elif c == '"':
            self.lex, self.is_key, self.esc = "s", False, 0
        elif c == "-" or c.isdigit() and c.isascii():
            self.lex = "n"
            self.num = N_MINUS if c == "-" else N_ZERO if c == "0" else N_INT
        elif c in "tfn":
            self.lex, self.lit = "l", {"t": "rue", "f": "alse", "n": "ull"}[c]
        else:
            return False
        return True

    def _close(self, kind: str) -> bool:
        if not self.stack or self.stack[-1] != kind:
            return False
        self.stack.pop()
        self._value_done(self.pos + 1)
        return True

    def _value_done(self, end: int) -> None:
        if len(self.stack) == 1 and self.stack[0] == "o" and self.members and self.members[-1][2] is None:
            self.members[-1][2] = end
        if not self.stack:
            self.expect = DONE
        else:
            self.expect = OBJ_NEXT if self.stack[-1] == "o" else ARR_NEXT

    def _string(self, c: str) -> bool:
        if self.esc == 1:
            if c == "u":
                self.esc = 5
                return True
            if c not in '"\\/bfnrt':
                return False
            self.esc = 0
            return True
        if self.esc > 1:
            if c not in _HEX:
                return False
            self.esc = 0 if self.esc == 2 else self.esc - 1
            return True
        if c == "\\":
            self.esc = 1
            return True
        if c == '"':
            self.lex = None
            if self.is_key:
                self.expect = COLON
                self.key_span = (self.key_start, self.pos + 1)
            else:
                self._value_done(self.pos + 1)
            return True
        return ord(c) >= 0x20                     # raw control characters are not JSON

    def _number(self, c: str) -> bool:
        """True if `c` continues the number (and advances its state)."""
        d = c.isdigit() and c.isascii()
        s = self.num
        if s == N_MINUS:
            if d:
                self.num = N_ZERO if c == "0" else N_INT
                return True
            return False
        if s in (N_ZERO, N_INT):
            if d and s == N_INT:
                return True
            if c == ".":
                self.num = N_DOT
                return True
            if c in "eE":
                self.num = N_E
                return True
            return False
        if s in (N_DOT, N_FRAC):
            if d:
                self.num = N_FRAC
                return True
            if s == N_FRAC and c in "eE":
                self.num = N_E
                return True
            return False
        if s == N_E:
            if c in "+-":
                self.num = N_ESIGN
                return True
            if d:
                self.num = N_EXP
                return True
            return False
        if d:                                     # N_ESIGN, N_EXP
            self.num = N_EXP
            return True
        return False


class CallTracker:
    """One call object `{"name": "f", "arguments": {...}}` read as it arrives.

    `name` is set once the name's string closes (and it is a known tool, when `tools` is
    given); `args_text()` is the arguments' raw text so far. `status` after each feed is
    "ok", "done" (the object closed) or "fail" (not valid JSON, or not a call: the name is
    not a string or not a tool, the arguments are not an object, the object closed without
    a name)."""

    def __init__(self, name_keys: tuple[str, ...] = ("name",),
                 arg_keys: tuple[str, ...] = ("arguments", "parameters"),
                 tools: Collection[str] | None = None) -> None:
        self.scan = JsonScanner()
        self.text = ""
        self.name_keys, self.arg_keys, self.tools = name_keys, arg_keys, tools
        self.name: str | None = None
        self.args_start: int | None = None
        self.args_end: int | None = None
        self._keys: list[str] = []                 # the members' decoded keys

    def feed(self, c: str) -> str:
        if not self.text and c in _WS:
            return "ok"                            # whitespace before the object
        if not self.text and c != "{":
            return "fail"
        self.text += c
        if not self.scan.feed(c):
            return "fail"
        if not self._check_members():
            return "fail"
        if self.scan.done:
            if self.name is None:
                return "fail"
            return "done"
        return "ok"

    def _check_members(self) -> bool:
        members = self.scan.members
        while len(self._keys) < len(members):     # a key is complete once its value begins
            a, b = members[len(self._keys)][0]
            self._keys.append(json.loads(self.text[a:b]))
        if not members:
            return True
        # only the last member can change: the earlier ones are complete and were checked
        for key, (_, start, end) in zip(self._keys[-1:], members[-1:]):
            if key in self.arg_keys and self.args_start is None:
                if self.text[start] != "{":
                    return False
                self.args_start = start
            if key in self.arg_keys and start == self.args_start and end is not None:
                self.args_end = end
            if key in self.name_keys and self.name is None and end is not None:
                if self.text[start] != '"':
                    return False
                name = json.loads(self.text[start:end])
                if not name or (self.tools is not None and name not in self.tools):
                    return False
                self.name = name
        return True

    def args_text(self) -> str:
        if self.args_start is None:
            return "{}" if self.scan.done else ""
        return self.text[self.args_start:self.args_end if self.args_end is not None else len(self.text)]


class PyListTracker:
    """Where a pythonic call list `[f(a=1, b="x"), g()]` ends: brackets outside string
    literals. `feed` returns "ok", "done" (the list closed) or "fail" (not a list)."""

    def __init__(self) -> None:
        self.text = ""
        self.depth = 0
        self.quote = ""              # the open string's quote character
        self.esc = False

    def feed(self, c: str) -> str:
        if not self.text and c in _WS:
            return "ok"
        if not self.text and c != "[":
            return "fail"
        self.text += c
        if self.quote:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == self.quote:
                self.quote = ""
            return "ok"
        if c in "'\"":
            self.quote = c
        elif c in "([{":
            self.depth += 1
        elif c in ")]}":
            self.depth -= 1
            if self.depth < 0:
                return "fail"
            if self.depth == 0:
                return "done"
        return "ok"
