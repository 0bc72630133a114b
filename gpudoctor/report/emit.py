"""The one output path: `emit(result, outputs)` renders a Result in each asked format and writes it.

Every format is a `render(result) -> str` (in the manner of ruff's Emitter): it shows what the Result holds
and decides nothing. A new format is one function and one row of FORMATS (docs/architecture.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpudoctor.report import json_report, junit, prometheus, text
from gpudoctor.report.annotations import render_concise, render_github
from gpudoctor.report.result import Result

FORMATS: dict[str, Callable[[Result], str]] = {
    "text": text.render,
    "json": json_report.render,
    "github": render_github,
    "concise": render_concise,
    "junit": junit.render,
    "prometheus": prometheus.render,
}


@dataclass(frozen=True)
class Output:
    format: str  # a key of FORMATS
    path: str | None = None  # a file (written atomically, fileio.write_output); None: standard output


def emit(result: Result, outputs: list[Output]) -> None:
    """Each output in the order given (a file that cannot be written stops the ones after it: exit 2)."""
    for out in outputs:
        if out.path is None:
            shown = replace(result, color=text.wants_color(sys.stdout)) if out.format == "text" else result
            sys.stdout.write(FORMATS[out.format](shown))
            sys.stdout.flush()
        else:
            from gpudoctor.fileio import write_output

            write_output(out.path, FORMATS[out.format](result), what=f"--{out.format}")
