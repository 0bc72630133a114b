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
    if os.path.splitext(path)[1].lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--config {path}: broken JSON at line {e.lineno}: {e.msg}") from None
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"--config {path}: {_unreadable(e)}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"--config {path}: broken YAML{where}: {problem}") from None
        except (ValueError, RecursionError) as e:  # see _unreadable
            raise ConfigError(f"--config {path}: {_unreadable(e)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping at the top level, got {type(data).__name__}")
    _check_expanded_size(data, path)
    return data


# YAML aliases can build what no training config means: a mapping that contains itself
# (`a: &x {b: *x}`), or aliases of aliases that expand to billions of values. The checks walk
# the config as a tree, so both are refused here instead of hanging or recursing forever.
MAX_VALUES = 1_000_000


def _check_expanded_size(data, path: str) -> None:
    count = 0
    # a value and the ids of the containers it is inside
    stack: list[tuple[object, frozenset[int]]] = [(data, frozenset())]
    while stack:
        node, inside = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(f"--config {path}: expands to more than {MAX_VALUES:,} values (YAML aliases of aliases?)")
        if isinstance(node, (dict, list)):
            if id(node) in inside:
                raise ConfigError(
                    f"--config {path}: a YAML alias refers to a value that contains it (the config never ends)"
                )
            inside = inside | {id(node)}
            stack.extend((child, inside) for child in (node.values() if isinstance(node, dict) else node))


def _unreadable(e: Exception) -> str:
    """Parsable text Python still cannot hold: lists nested thousands deep, integers of thousands of digits."""
    if isinstance(e, RecursionError):
        return "nested too deeply to read"
    return f"cannot read ({str(e).split(';')[0]})"
