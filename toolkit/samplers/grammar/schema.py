"""JSON schema -> regex through outlines-core, refusing what it would silently ignore.

outlines-core's converter drops some keywords without a word (numeric bounds, uniqueItems,
`not`, conditionals, ...), so a constrained output could still fail the schema. In strict
mode (the default) such a schema is rejected with the keyword and its path; strict=False
accepts it and constrains only what outlines-core understands.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import outlines_core

# Keywords outlines-core 0.2 parses but does not enforce.
IGNORED_KEYWORDS = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "uniqueItems", "contains", "minContains", "maxContains", "not", "if", "then", "else",
    "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
    "dependencies", "unevaluatedProperties", "unevaluatedItems",
})
# Where a sub-schema sits under a keyword: a schema, a list of schemas, or a name -> schema map.
_SUB_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
            "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SUB_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUB_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def load_schema(schema: dict | str) -> dict:
    """The schema as a dict; a string must be JSON text of an object."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"JSON schema text is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be a dict (or its JSON text), got {type(schema).__name__}")
    return schema


def _subschemas(node: dict, path: str) -> Iterator[tuple[str, Any]]:
    for k in _SUB_ONE:
        if isinstance(node.get(k), dict):
            yield f"{path}/{k}", node[k]
    for k in _SUB_LIST:
        if isinstance(node.get(k), list):
            yield from ((f"{path}/{k}/{i}", s) for i, s in enumerate(node[k]))
    for k in _SUB_MAP:
        if isinstance(node.get(k), dict):
            yield from ((f"{path}/{k}/{n}", s) for n, s in node[k].items())


def unenforced_keywords(schema: dict) -> list[str]:
    """'path: keyword' for every place where outlines-core would not enforce the schema."""
    found: list[str] = []
    stack: list[tuple[str, Any]] = [("#", schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        found += [f"{path}: {k}" for k in sorted(IGNORED_KEYWORDS & node.keys())]
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            found.append(f"{path}: allOf with more than one schema (outlines-core concatenates them)")
        if ("minLength" in node or "maxLength" in node) and ("pattern" in node or "format" in node):
            found.append(f"{path}: pattern/format together with minLength/maxLength "
                         "(outlines-core keeps only the length)")
        if isinstance(node.get("properties"), dict) and isinstance(node.get("required"), list):
            missing = [r for r in node["required"] if r not in node["properties"]]
            if missing:
                found.append(f"{path}: required names without a property schema {missing}")
        if "properties" in node and ("minProperties" in node or "maxProperties" in node):
            found.append(f"{path}: minProperties/maxProperties beside properties")
        stack.extend(_subschemas(node, path))
    return found


def schema_to_regex(schema: dict, *, whitespace_pattern: str | None = None,
                    strict: bool = True) -> str:
    """The regex whose matches are the JSON texts outlines-core allows for `schema`.

    Raises ValueError: the schema is not a valid JSON schema (meta-schema check), outlines-core
    cannot convert it, or (strict) it uses keywords outlines-core would not enforce.
    """
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ValueError(f"invalid JSON schema at {'/'.join(map(str, e.absolute_path)) or '#'}: "
                         f"{e.message}") from None
    if strict:
        bad = unenforced_keywords(schema)
        if bad:
            raise ValueError("the JSON schema uses keywords outlines-core would not enforce: "
                             + "; ".join(bad) + ". Remove them, or pass strict=False to constrain "
                             "only the rest")
    try:
        return outlines_core.json_schema.build_regex_from_schema(json.dumps(schema), whitespace_pattern)
    except (ValueError, TypeError) as e:
        # outlines-core's own text ends in advice meant for its developers; keep its first line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"outlines-core cannot build a grammar from this JSON schema ({first}); give a schema "
                         "with a \"type\" (object, array, string, number, integer, boolean, null), "
                         "\"enum\", \"const\", \"anyOf\"/\"oneOf\"/\"allOf\" or \"$ref\"") from None
