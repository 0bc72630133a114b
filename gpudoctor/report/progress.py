"""A progress line on stderr for steps that can take over a second (the torch import, cluster queries,
smoke phases). Only on a terminal: never in --json output, never when stderr is a pipe or a file, so
logs and CI output stay clean.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
from collections.abc import Iterator

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
FIRST_FRAME_AFTER_S = 0.3  # a step that ends sooner shows nothing
FRAME_S = 0.1


def wanted(stream=None) -> bool:
    stream = stream or sys.stderr
    if os.environ.get("TERM") == "dumb" or os.environ.get("CI"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def spinner(message: str, enabled: bool = True, stream=None) -> Iterator[None]:
    """`with spinner("importing torch"): ...` -- a spinning line on stderr while the block runs, erased after."""
    stream = stream or sys.stderr
    if not (enabled and wanted(stream)):
        yield
        return
    done = threading.Event()

    def spin() -> None:
        if done.wait(FIRST_FRAME_AFTER_S):
            return
        for frame in itertools.cycle(FRAMES):
            try:
                stream.write(f"\r{frame} {message}…")
                stream.flush()
            except (OSError, ValueError):
                return
            if done.wait(FRAME_S):
                break
        try:
            stream.write("\r\x1b[2K")
            stream.flush()
        except (OSError, ValueError):
            pass

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(1.0)
