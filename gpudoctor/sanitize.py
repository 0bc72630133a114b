"""Text that came from somewhere else (another rank, a snapshot recorded on another machine, a file) made
safe to show: terminal escape sequences dropped, other control characters written as \\xNN, length bounded.

One sanitiser for every output (text, JSON, JUnit, any later format): what reaches a terminal or a CI log
never rewrites its title or colours, whoever wrote the value (another gpudoctor version, another program on
the job's port, a hostname set to ESC ]0;...BEL).
"""

from __future__ import annotations

import re
from typing import Any

_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A host name is at most 253 characters, a GPU name or an environment value rarely over a few hundred: a
# longer string from another machine is cut (and says so) rather than filling the screen.
TEXT_LIMIT = 4096


def clean(text) -> str:
    """A string safe to write to a terminal: escape sequences dropped, other control characters as \\xNN."""
    text = _ESCAPE_SEQUENCE.sub("", str(text))
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def bounded(text: str, limit: int = TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def clean_tree(value: Any, limit: int = TEXT_LIMIT) -> Any:
    """JSON-like data with every string (keys too) cleaned and bounded; other values as they are."""
    if isinstance(value, str):
        return bounded(clean(value), limit)
    if isinstance(value, dict):
        return {clean_tree(k, limit) if isinstance(k, str) else k: clean_tree(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_tree(v, limit) for v in value]
    return value
