"""Function calls as a grammar: constrained decoding of tool calls, and schema checks of received calls.

The GRASP agent explores a knowledge graph through function calls (docs/agent.md); the paper constrains
decoding wherever the model provider allows it, so that every call names a real function with
arguments that fit its JSON schema. For our own model (local_backend.LocalBackend) this module turns
the function definitions into a grammar over characters and lets the decoder keep only tokens whose
text stays inside it. The language of one call is

    {"name": "<one of the function names>", "arguments": <object fitting that function's schema>}

written the way json.dumps writes it (", " and ": " separators), keys in schema order, optional keys
may be left out, no other keys, strings at most `max_string` characters. What is constrained: the
function name (one of the known names), the JSON itself (well-formed, parseable by json.loads), the
keys (all required ones, no unknown ones), enums (a value from the list), types (string, integer,
boolean, null, nested objects). Not constrained: the content of free strings (a SPARQL query may
still be wrong SPARQL), string formats and number ranges.

The grammar is a regular language, consumed one character at a time by Brzozowski derivatives:
`node.step(ch)` is the language of the rest after reading `ch` (None: no string continues so).

    grammar = call_grammar(tools)                 # tools in the OpenAI format
    state = grammar.consume('{"name": "exe')      # None if the text leaves the grammar
    state.forced()                                # 'cute", "arguments": {"kg": ' ... text every path shares
    state.shortest()                              # a shortest completion (to close a call at the budget)

`schema_errors(schema, args)` checks a call received from a remote model against the same subset.
"""

import json
from functools import lru_cache


class Node:
    """A regular language of strings (the rest of a call), consumed one character at a time."""

    nullable = False  # the empty string is in the language: the text may end here
    exact = False  # the language is the single string forced()

    def step(self, ch: str) -> "Node | None":
        raise NotImplementedError

    def forced(self) -> str:
        """A prefix every string of the language starts with."""
        return ""

    def shortest(self) -> str:
        raise NotImplementedError

    def consume(self, text: str) -> "Node | None":
        """The language after reading `text`, or None if no string of the language starts with it."""
        node = self
        for ch in text:
            node = node.step(ch)
            if node is None:
                return None
        return node


class Lit(Node):
    def __init__(self, text: str):
        self.text, self.nullable, self.exact = text, text == "", True

    def step(self, ch):
        return Lit(self.text[1:]) if self.text[:1] == ch else None

    def forced(self):
        return self.text

    def shortest(self):
        return self.text


class Seq(Node):
    def __init__(self, first: Node, rest: Node):
        self.first, self.rest = first, rest
        self.nullable = first.nullable and rest.nullable
        self.exact = first.exact and rest.exact

    def step(self, ch):
        options = []
        head = self.first.step(ch)
        if head is not None:
            options.append(seq(head, self.rest))
        if self.first.nullable:  # the first part may be over: the character starts the rest
            options.append(self.rest.step(ch))
        return alt(*options)

    def forced(self):
        return self.first.forced() + (self.rest.forced() if self.first.exact else "")

    def shortest(self):
        return self.first.shortest() + self.rest.shortest()


class Alt(Node):
    def __init__(self, options: list[Node]):
        self.options = options
        self.nullable = any(o.nullable for o in options)

    def step(self, ch):
        return alt(*(o.step(ch) for o in self.options))

    def forced(self):
        prefixes = [o.forced() for o in self.options]
        common = prefixes[0]
        for p in prefixes[1:]:
            while not p.startswith(common):
                common = common[:-1]
        return common

    def shortest(self):
        return min((o.shortest() for o in self.options), key=len)


class JsonString(Node):
    """The rest of a JSON string after its opening quote: at most `left` more characters of content
    (an escape counts its backslash), then the closing quote. `esc`: 0 plain, 1 after a backslash,
    2..5 inside \\uXXXX with 6 - esc hex digits to go."""

    def __init__(self, left: int, esc: int = 0):
        self.left, self.esc = left, esc
        self.exact = left <= 0 and esc == 0  # at the cap only the closing quote is left

    def step(self, ch):
        if self.esc == 1:
            return (
                JsonString(self.left, 2)
                if ch == "u"
                else JsonString(self.left)
                if ch in '"\\/bfnrt'
                else None
            )
        if self.esc >= 2:
            ok = ch in "0123456789abcdefABCDEF"
            return None if not ok else JsonString(self.left, self.esc + 1 if self.esc < 5 else 0)
        if ch == '"':
            return Lit("")
        if ord(ch) < 0x20 or self.left <= 0:  # control characters must be escaped; the cap allows only '"'
            return None
        return JsonString(self.left - 1, 1 if ch == "\\" else 0)

    def forced(self):
        return '"' if self.esc == 0 and self.left <= 0 else ""

    def shortest(self):
        return {0: '"', 1: 'n"'}.get(self.esc, "0" * (6 - self.esc) + '"')


class JsonInteger(Node):
    """A non-negative JSON integer of at most `left` more digits (no leading zeros)."""

    def __init__(self, left: int = 9, started: bool = False, zero: bool = False):
        self.left, self.started, self.zero = left, started, zero
        self.nullable = started

    def step(self, ch):
        if not ch.isdigit() or not ch.isascii() or self.zero or self.left <= 0:
            return None
        return JsonInteger(self.left - 1, True, zero=not self.started and ch == "0")

    def shortest(self):
        return "" if self.started else "0"


def seq(*nodes: Node) -> Node:
    """Concatenation; empty literals are dropped and literals next to each other are merged."""
    nodes = [n for n in nodes if not (isinstance(n, Lit) and n.text == "")]
    if not nodes:
        return Lit("")
    node = nodes[-1]
    for first in reversed(nodes[:-1]):
        if isinstance(first, Lit) and isinstance(node, Lit):
            node = Lit(first.text + node.text)
        else:
            node = Seq(first, node)
    return node


def alt(*options: Node | None) -> Node | None:
    """Union of the options that exist (None: none does)."""
    options = [o for o in options if o is not None]
    return None if not options else options[0] if len(options) == 1 else Alt(options)


# ---------------------------------------------------------------------------- JSON schema -> grammar


def value_grammar(schema: dict, max_string: int) -> Node:
    """The JSON texts of values fitting `schema` (the subset described in the module docstring)."""
    if "enum" in schema:
        return alt(*(Lit(json.dumps(v, ensure_ascii=False)) for v in schema["enum"]))
    types = schema.get("type")
    if isinstance(types, list):
        return alt(*(value_grammar({**schema, "type": t}, max_string) for t in types))
    if types == "string":
        return seq(Lit('"'), JsonString(max_string))
    if types == "integer":
        return JsonInteger()
    if types == "boolean":
        return alt(Lit("true"), Lit("false"))
    if types == "null":
        return Lit("null")
    if types == "object":
        return object_grammar(schema, max_string)
    raise ValueError(
        f"cannot constrain decoding to the JSON schema {schema!r}: types string, integer, "
        f"boolean, null, object and enums are supported"
    )


def object_grammar(schema: dict, max_string: int) -> Node:
    """`{...}` with the schema's keys in order: each required key present, optional ones maybe not."""
    props = list(schema.get("properties", {}).items())
    required = set(schema.get("required", []))
    unknown = required - {k for k, _ in props}
    if unknown:  # a schema from a client of web/openai_api.py, not only our own
        raise ValueError(f"the required keys {sorted(unknown)} are not among the properties of {schema!r}")
    values = [value_grammar(s, max_string) for _, s in props]

    @lru_cache(maxsize=None)
    def members(i: int, first: bool) -> Node:
        """The object's text from key i on: the next present key j >= i (no required key skipped), or '}'."""
        options = []
        for j in range(i, len(props)):
            key = json.dumps(props[j][0])
            options.append(seq(Lit(("" if first else ", ") + key + ": "), values[j], members(j + 1, False)))
            if props[j][0] in required:
                break
        else:
            options.append(Lit("}"))
        return alt(*options)

    return seq(Lit("{"), members(0, True))


def call_grammar(tools: list[dict], max_string: int = 1500, end: str = "") -> Node:
    """One call `{"name": ..., "arguments": {...}}` to one of `tools` (OpenAI format), then `end`."""
    calls = []
    for tool in tools:
        fn = tool["function"]
        args = object_grammar(fn.get("parameters") or {"type": "object", "properties": {}}, max_string)
        calls.append(seq(Lit('{"name": ' + json.dumps(fn["name"]) + ', "arguments": '), args, Lit("}" + end)))
    grammar = alt(*calls)
    if grammar is None:
        raise ValueError("no functions to call: constrained decoding needs at least one tool")
    return grammar


# ---------------------------------------------------------------------------- checks of received calls

_TYPES = {
    "string": str,
    "integer": int,
    "boolean": bool,
    "object": dict,
    "null": type(None),
    "number": (int, float),
    "array": list,
}


def schema_errors(schema: dict, value, path: str = "arguments") -> list[str]:
    """What makes `value` not fit `schema` (required keys, unknown keys, types, enums); [] if it fits."""
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        ok = any(
            isinstance(value, _TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool))
            for t in names
            if t in _TYPES
        )
        if not ok:
            return [f"{path} must be {' or '.join(names)}, not {json.dumps(value)[:80]}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path} must be one of {json.dumps(schema['enum'])}, not {json.dumps(value)[:80]}"]
    errors = []
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        errors += [
            f"{path} lacks the required key {k!r}" for k in schema.get("required", []) if k not in value
        ]
        if schema.get("additionalProperties", True) is False:
            errors += [
                f"{path} has the unknown key {k!r} (known: {', '.join(props)})"
                for k in value
                if k not in props
            ]
        for key, sub in value.items():
            if key in props:
                errors += schema_errors(props[key], sub, f"{path}.{key}")
    return errors
