"""The one output path: `emit(result, outputs)` renders a Result in each asked format and writes it.

Every format is a `render(result) -> str` (in the manner of ruff's Emitter): it shows what the Result holds
and decides nothing. A new format is one function and one row of FORMATS (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpudoctor.report.result import Result

# format -> (module of gpudoctor.report, its render function); the module is imported when its format is
# asked for: a command writes one or two formats, and the JUnit one alone costs as much as the text report.
FORMATS: dict[str, tuple[str, str]] = {
    "text": ("text", "render"),
    "json": ("json_report", "render"),
    "github": ("annotations", "render_github"),
    "concise": ("annotations", "render_concise"),
    "sarif": ("sarif", "render"),  # SARIF 2.1.0 for code scanning
    "junit": ("junit", "render"),
    "prometheus": ("prometheus", "render"),
}


def renderer(format: str) -> Callable[[Result], str]:
    module, function = FORMATS[format]
    return getattr(importlib.import_module(f"gpudoctor.report.{module}"), function)


@dataclass(frozen=True)
class Output:
    format: str  # a key of FORMATS
    path: str | None = None  # a file (written atomically, fileio.write_output); None: standard output


def emit(result: Result, outputs: list[Output]) -> None:
    """Each output in the order given (a file that cannot be written stops the ones after it: exit 2)."""
    for out in outputs:
        if out.path is None:
            shown = result
            if out.format == "text":
                from gpudoctor.report.text import wants_color

                shown = replace(result, color=wants_color(sys.stdout))
            sys.stdout.write(renderer(out.format)(shown))
            sys.stdout.flush()
        else:
            from gpudoctor.fileio import write_output

            write_output(out.path, renderer(out.format)(result), what=f"--{out.format}")
