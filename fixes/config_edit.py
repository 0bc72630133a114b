"""Edits of a training config's key: YAML in place (comments, order, quoting, indentation kept), JSON.

YAML: the value of an existing key is replaced on its own line at the position ruamel.yaml's
round-trip loader reports, so every other byte of the file stays as written; a key that does not
exist yet is added through ruamel.yaml's round-trip dump (which keeps comments and key order).
A value behind a YAML anchor or alias, a block scalar, or a flow collection is not edited (the
change would reach other keys, or cannot be made on one line): EditError says so.
Every result is re-read with yaml.safe_load / json.loads and must hold the new value.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

from gpudoctor.fixes.sbatch_edit import EditError


def is_json(path: str) -> bool:
    return path.lower().endswith(".json")


def set_key(text: str, path: str, key: str, value: object) -> str:
    new = _set_json(text, key, value) if is_json(path) else _set_yaml(text, key, value)
    _verify(new, path, key, value)
    return new


def _lc(node: Any) -> Any:
    """ruamel.yaml's line/column record of a loaded mapping or sequence."""
    return node.lc


def _segments(key: str) -> list[str]:
    return [s for s in key.split(".") if s]


def _yaml_scalar(value: object, quote: str | None) -> str:
    import yaml

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if quote == "'":
        return "'" + text.replace("'", "''") + "'"
    if quote == '"':
        return json.dumps(text)
    try:
        plain = yaml.safe_load(text) == text and "#" not in text and ": " not in text
    except yaml.YAMLError:
        plain = False
    return text if plain else json.dumps(text)


_MISSING = object()


def _child(node: Any, seg: str) -> Any:
    """node's item seg: a list's index or a mapping's key; _MISSING when it has none."""
    if isinstance(node, list) and seg.isdigit() and int(seg) < len(node):
        return node[int(seg)]
    if isinstance(node, dict) and seg in node:
        return node[seg]
    return _MISSING


def _navigate(data: Any, segments: list[str]) -> Any:
    """The node that holds the key's last segment; EditError when a segment before it is not there."""
    node = data
    for seg in segments[:-1]:
        node = _child(node, seg)
        if node is _MISSING:
            raise EditError(f"no key {'.'.join(segments)} in the config")
    return node


def _set_yaml(text: str, key: str, value: object) -> str:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    rt = YAML(typ="rt")
    rt.preserve_quotes = True
    try:
        data = rt.load(text)
    except (YAMLError, ValueError) as e:
        raise EditError(f"the config does not parse as YAML ({str(e).splitlines()[0]})") from None
    segments = _segments(key)
    parent = _navigate(data, segments)
    leaf = segments[-1]
    _refuse_shared(data, segments)
    if hasattr(parent, "fa") and parent.fa.flow_style():
        raise EditError(f"{key} is inside a flow collection ({{...}} / [...]): edit it by hand")
    if isinstance(parent, dict) and leaf in parent:
        if hasattr(parent, "_ok") and leaf not in parent._ok:
            raise EditError(f"{key} is inherited through a YAML merge key (<<: *anchor): edit it by hand")
        line_no, col = _lc(parent).value(leaf)
        return _replace_scalar(text, line_no, col, value)
    if isinstance(parent, list) and leaf.isdigit() and int(leaf) < len(parent):
        line_no, col = _lc(parent).item(int(leaf))
        return _replace_scalar(text, line_no, col, value)
    if not isinstance(parent, dict):
        raise EditError(f"{key}: its parent is not a mapping")
    parent[leaf] = value
    from ruamel.yaml.util import load_yaml_guess_indent

    _, indent, block_seq_indent = load_yaml_guess_indent(text)
    rt.indent(mapping=indent or 2, sequence=(indent or 2) + (block_seq_indent or 0), offset=block_seq_indent or 0)
    rt.width = 4096
    out = io.StringIO()
    rt.dump(data, out)
    return out.getvalue()


def _refuse_shared(data: Any, segments: list[str]) -> None:
    """A value inside an anchored node (`&name`) is shared by every alias and merge of it: never edited here."""
    node = data
    for seg in segments:
        anchor = getattr(getattr(node, "anchor", None), "value", None)
        if anchor:
            raise EditError(
                f"{'.'.join(segments)} is inside the anchor &{anchor}, which other keys reuse: edit it by hand"
            )
        node = _child(node, seg)
        if node is _MISSING:
            return
    anchor = getattr(getattr(node, "anchor", None), "value", None)
    if anchor:
        raise EditError(f"{'.'.join(segments)} carries the anchor &{anchor}, which other keys reuse: edit it by hand")


_SCALAR = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^#\n\r]*?)(\s+#.*)?(\r?\n)?$""", re.S)


def _replace_scalar(text: str, line_no: int, col: int, value: object) -> str:
    lines = text.splitlines(keepends=True)
    if line_no >= len(lines):
        raise EditError("the key's value is not where the YAML reader put it")
    line = lines[line_no]
    rest = line[col:]
    if rest[:1] in ("&", "*", "|", ">", "{", "[", "!") or not rest.strip():
        raise EditError("the value is an anchor, alias, tag, block scalar or collection: edit it by hand")
    m = _SCALAR.match(rest)
    if not m:
        raise EditError("the value spans more than one line: edit it by hand")
    old = m.group(1)
    quote = old[0] if old[:1] in ("'", '"') else None
    new = _yaml_scalar(value, quote)
    if isinstance(value, bool) and old.strip() in ("True", "False", "TRUE", "FALSE"):
        new = new.capitalize() if old.strip()[1:2].islower() else new.upper()  # keep the file's spelling
    lines[line_no] = line[:col] + new + rest[len(old) :]
    return "".join(lines)


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null')


def _set_json(text: str, key: str, value: object) -> str:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise EditError(f"the config does not parse as JSON ({e})") from None
    segments = _segments(key)
    place = _json_value_position(text, segments)
    if place is not None:  # an existing scalar: replace its token only, every other byte stays
        line_no, col = place
        lines = text.splitlines(keepends=True)
        m = _JSON_TOKEN.match(lines[line_no], col)
        if m:
            lines[line_no] = lines[line_no][:col] + json.dumps(value, ensure_ascii=False) + lines[line_no][m.end() :]
            return "".join(lines)
    parent = _navigate(data, segments)
    leaf = segments[-1]
    if isinstance(parent, list) and leaf.isdigit() and int(leaf) < len(parent):
        parent[int(leaf)] = value
    elif isinstance(parent, dict):
        parent[leaf] = value
    else:
        raise EditError(f"{key}: its parent is not an object")
    indent_match = re.search(r"\n([ \t]+)\S", text)
    indent = indent_match.group(1) if indent_match else None
    out = json.dumps(data, indent=indent if indent else None, ensure_ascii=False)
    return out + ("\n" if text.endswith("\n") else "")


def _json_value_position(text: str, segments: list[str]) -> tuple[int, int] | None:
    """(line, column) of an existing key's value, from ruamel.yaml's reader (JSON is YAML 1.2 flow)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        data = YAML(typ="rt").load(text)
        parent = _navigate(data, segments)
        leaf = segments[-1]
        if isinstance(parent, dict) and leaf in parent:
            return _lc(parent).value(leaf)
        if isinstance(parent, list) and leaf.isdigit() and int(leaf) < len(parent):
            return _lc(parent).item(int(leaf))
    except (YAMLError, ValueError, EditError, AttributeError):
        return None
    return None


def _verify(new: str, path: str, key: str, value: object) -> None:
    import yaml

    try:
        data = json.loads(new) if is_json(path) else yaml.safe_load(new)
        node = _navigate(data, _segments(key))
        leaf = _segments(key)[-1]
        got = node[int(leaf)] if isinstance(node, list) else node[leaf]
    except (ValueError, yaml.YAMLError, KeyError, IndexError, TypeError, EditError) as e:
        raise EditError(f"the edited config does not re-read ({e})") from None
    if got != value and str(got) != str(value):
        raise EditError(f"the edited config reads {key}={got!r}, not {value!r}")
