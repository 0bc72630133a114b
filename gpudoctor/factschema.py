"""Whether a snapshot file follows the facts contract (gpudoctor/schemas/facts.schema.json, which
docs/facts.schema.json links to).

A replayed snapshot comes from outside the process: a hand-edited or damaged file
("gpus": "eight") is refused with one line (exit 2) instead of reaching checks written for what
the probes produce. This reads the part of JSON Schema 2020-12 the facts schema uses (KEYWORDS);
jsonschema itself is a test dependency only, and the tests compare the two.

    first_problem(data)  -> None, or 'nvidia.gpus: expected array, got string'
"""

from __future__ import annotations

import functools
import json
import re
import reprlib
from importlib import resources

SCHEMA_FILE = "schemas/facts.schema.json"
KEYWORDS = frozenset(
    """type const enum minLength pattern properties required additionalProperties propertyNames
    prefixItems items minItems maxItems $ref anyOf oneOf not if then else""".split()
)
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description"})

_Problem = tuple[tuple, str]  # (path, message)


@functools.lru_cache(maxsize=1)
def load_schema() -> dict:
    return json.loads(resources.files("gpudoctor").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def first_problem(data, schema: dict | None = None) -> str | None:
    """Where data first breaks the schema, as one short line; None when it follows it."""
    schema = load_schema() if schema is None else schema
    problem = _check(data, schema, schema, ())
    if problem is None:
        return None
    path, message = problem
    return f"{'.'.join(map(str, path)) or 'top level'}: {message}"


def _type_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _is(value, kind: str) -> bool:
    actual = _type_of(value)
    if kind == "integer":
        return actual == "integer" or (actual == "number" and float(value).is_integer())
    if kind == "number":
        return actual in ("integer", "number")
    return actual == kind


def _equal(a, b) -> bool:
    """JSON equality: true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if _is(a, "number") and _is(b, "number"):
        return a == b
    return type(a) is type(b) and a == b


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, 40, 40, 4, 3


def _short(value) -> str:
    """A value as a message can show it: short, however large or deep the value is."""
    return _REPR.repr(value)


def _resolve(ref: str, root: dict) -> dict:
    if not ref.startswith("#/"):
        raise ValueError(f"facts schema: only local $ref is supported, got {ref!r}")
    node = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _check(value, schema, root: dict, path: tuple) -> _Problem | None:
    """The first problem, depth first; for anyOf/oneOf the deepest problem of the closest branch."""
    if schema is True:
        return None
    if schema is False:
        return path, "not allowed here"
    for step in (_check_ref, _check_type, _check_value, _check_object, _check_array, _check_logic):
        problem = step(value, schema, root, path)
        if problem is not None:
            return problem
    return None


def _check_ref(value, schema, root, path):
    return _check(value, _resolve(schema["$ref"], root), root, path) if "$ref" in schema else None


def _check_type(value, schema, root, path):
    if "type" not in schema:
        return None
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if any(_is(value, k) for k in kinds):
        return None
    return path, f"expected {' or '.join(kinds)}, got {_type_of(value)} {_short(value)}"


def _check_value(value, schema, root, path):
    if "const" in schema and not _equal(value, schema["const"]):
        return path, f"expected {_short(schema['const'])}, got {_short(value)}"
    if "enum" in schema and not any(_equal(value, e) for e in schema["enum"]):
        return path, f"expected one of {', '.join(_short(e) for e in schema['enum'])}, got {_short(value)}"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return path, f"expected at least {schema['minLength']} character(s), got {_short(value)}"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return path, f"{_short(value)} does not match {schema['pattern']!r}"
    return None


def _check_object(value, schema, root, path):
    if not isinstance(value, dict):
        return None
    for name in schema.get("required", ()):
        if name not in value:
            return path, f"missing {name!r}"
    props = schema.get("properties", {})
    for name, item in value.items():
        if "propertyNames" in schema:
            problem = _check(name, schema["propertyNames"], root, path + (name,))
            if problem is not None:
                return path + (name,), f"name not allowed here ({problem[1]})"
        if name in props:
            sub = props[name]
        elif "additionalProperties" in schema:
            sub = schema["additionalProperties"]
        else:
            continue
        problem = _check(item, sub, root, path + (name,))
        if problem is not None:
            return problem
    return None


def _check_array(value, schema, root, path):
    if not isinstance(value, list):
        return None
    if "minItems" in schema and len(value) < schema["minItems"]:
        return path, f"expected at least {schema['minItems']} item(s), got {len(value)}"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return path, f"expected at most {schema['maxItems']} item(s), got {len(value)}"
    prefix = schema.get("prefixItems", [])
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else schema.get("items", True)
        problem = _check(item, sub, root, path + (i,))
        if problem is not None:
            return problem
    return None


def _check_logic(value, schema, root, path):
    if "anyOf" in schema:
        problems = [_check(value, s, root, path) for s in schema["anyOf"]]
        if all(problems):
            return _closest(problems)
    if "oneOf" in schema:
        problems = [_check(value, s, root, path) for s in schema["oneOf"]]
        matched = sum(p is None for p in problems)
        if matched == 0:
            return _closest(problems)
        if matched > 1:
            return path, "matches more than one of the allowed forms"
    if "not" in schema and _check(value, schema["not"], root, path) is None:
        return path, f"must not match {_short(schema['not'])}"
    if "if" in schema:
        branch = "then" if _check(value, schema["if"], root, path) is None else "else"
        if branch in schema:
            return _check(value, schema[branch], root, path)
    return None


def _closest(problems: list[_Problem | None]) -> _Problem:
    """The branch that got furthest into the value is the one the file meant (jsonschema's best_match, roughly);
    called when no branch matched, so every entry is a problem."""
    return max((p for p in problems if p is not None), key=lambda p: len(p[0]))
