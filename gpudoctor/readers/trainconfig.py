"""Loading a training config (YAML or JSON) given with --config. Interpreting it is the checks' job."""

from __future__ import annotations

import json
import os


class ConfigError(ValueError):
    """A config that cannot be read: one line, exit 2."""


def load_config(path: str) -> dict:
    from gpudoctor.fileio import FileIOError, read_input

    try:
        text = read_input(path, "--config")
    except FileIOError as e:
        raise ConfigError(str(e)) from None
    return parse_config(text, path, "--config")


def parse_config(text: str, path: str, what: str) -> dict:
    """A config's text as a mapping: JSON for a .json name, YAML (safe) otherwise; ConfigError names `what path`."""
    if os.path.splitext(path)[1].lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{what} {path}: broken JSON at line {e.lineno}: {e.msg}") from None
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"{what} {path}: {_unreadable(e)}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{what} {path}: broken YAML{where}: {problem}") from None
        except (ValueError, RecursionError) as e:  # see _unreadable
            raise ConfigError(f"{what} {path}: {_unreadable(e)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: expected a mapping at the top level, got {type(data).__name__}")
    _check_expanded_size(data, path, what)
    return data


# YAML aliases can build what no training config means: a mapping that contains itself
# (`a: &x {b: *x}`), or aliases of aliases that expand to billions of values. The checks walk
# the config as a tree, so both are refused here instead of hanging or recursing forever.
MAX_VALUES = 1_000_000


def _check_expanded_size(data, path: str, what: str = "--config") -> None:
    count = 0
    # a value and the ids of the containers it is inside
    stack: list[tuple[object, frozenset[int]]] = [(data, frozenset())]
    while stack:
        node, inside = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(f"{what} {path}: expands to more than {MAX_VALUES:,} values (YAML aliases of aliases?)")
        if isinstance(node, (dict, list)):
            if id(node) in inside:
                raise ConfigError(
                    f"{what} {path}: a YAML alias refers to a value that contains it (the config never ends)"
                )
            inside = inside | {id(node)}
            stack.extend((child, inside) for child in (node.values() if isinstance(node, dict) else node))


def _unreadable(e: Exception) -> str:
    """Parsable text Python still cannot hold: lists nested thousands deep, integers of thousands of digits."""
    if isinstance(e, RecursionError):
        return "nested too deeply to read"
    return f"cannot read ({str(e).split(';')[0]})"


def key_lines(path: str) -> dict[str, int]:
    """Each key's line in the config (1-based), by its dotted path as readers/dlconfig names settings
    ('data.loader.num_workers'; list items by index): where a finding about that setting points. YAML's
    composer keeps every node's position (JSON is read the same way); {} when the file cannot be composed,
    since a finding without a line still stands."""
    from gpudoctor.fileio import FileIOError, read_input

    try:
        return text_key_lines(read_input(path, "--config"))
    except FileIOError:
        return {}


def text_key_lines(text: str) -> dict[str, int]:
    """key_lines over a config's text already read."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, ValueError, RecursionError):
        return {}
    lines: dict[str, int] = {}
    stack: list[tuple[object, str]] = [(root, "")]
    seen: set[int] = set()
    while stack and len(lines) < MAX_VALUES:
        node, prefix = stack.pop()
        if id(node) in seen:  # an alias (the anchor comes first in the document): its keys are where the anchor is
            continue
        seen.add(id(node))
        children: list[tuple[object, str]] = []
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = f"{prefix}.{key.value}" if prefix else str(key.value)
                lines.setdefault(name, key.start_mark.line + 1)
                children.append((value, name))
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, f"{prefix}.{i}" if prefix else str(i)) for i, item in enumerate(node.value)]
        stack.extend(reversed(children))  # depth first in document order: an anchor before its aliases
    return lines
