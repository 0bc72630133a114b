"""Text that came from somewhere else (another rank, a snapshot recorded on another machine, a file) made
safe to show: terminal escape sequences dropped, other control characters written as \\xNN, length bounded.

One sanitiser for every output (text, JSON, JUnit, any later format): what reaches a terminal or a CI log
never rewrites its title or colours, whoever wrote the value (another gpudoctor version, another program on
the job's port, a hostname set to ESC ]0;...BEL).
"""

from __future__ import annotations

import json
import re
from typing import Any

_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
# A host name is at most 253 characters, a GPU name or an environment value rarely over a few hundred: a
# longer string from another machine is cut (and says so) rather than filling the screen.
TEXT_LIMIT = 4096


def clean(text, keep: str = "") -> str:
    """A string safe to write to a terminal: escape sequences dropped, other control characters as \\xNN
    (newline and tab stay; so do the characters in keep, for a format that escapes them its own way), a byte
    that was not UTF-8 (a surrogate escape of os.environ or a file read with surrogateescape) as \\xNN too:
    written raw, 0x80-0x9f are C1 controls to an 8-bit terminal, and no UTF-8 stream can encode a surrogate."""
    text = _ESCAPE_SEQUENCE.sub("", str(text))
    return _CONTROL.sub(lambda m: m.group() if m.group() in keep else _escaped(m.group()), text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
        code -= 0xDC00
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def json_text(value: Any, **dumps_options: Any) -> str:
    """json.dumps of value for a terminal or a file: every non-ASCII character escaped (ensure_ascii), and
    DEL too, the one control character JSON leaves raw (RFC 8259 requires escaping only U+0000-U+001F)."""
    return json.dumps(value, ensure_ascii=True, **dumps_options).replace("\x7f", "\\u007f")


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
