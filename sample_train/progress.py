"""Progress on stderr while the coordinator waits: a rich bar on a terminal only (issue 10: never in --json
or non-TTY output, so logs and CI output hold only the report)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported only when a bar is drawn
    from rich.progress import Progress as Bar
    from rich.progress import TaskID


class Progress:
    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.tty = sys.stderr.isatty() and not quiet
        self._bar: Bar | None = None
        self._task: TaskID | None = None
        self._last_label: str | None = None
        self._last_print = 0.0

    def __call__(self, info: dict) -> None:
        if self.quiet:
            return
        label = info.get("label") or info["stage"]
        if info["stage"] == "join":
            label = f"rendezvous: {info['joined']}/{info['world_size']} ranks joined"
        if self.tty:
            self._rich(label, info)

    def _rich(self, label: str, info: dict) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        if self._bar is None:
            self._bar = Bar(
                TextColumn("[bold]smoke[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(label, total=None)
        assert self._task is not None  # added together with the bar
        steps = info.get("steps")
        self._bar.update(self._task, description=label, total=steps, completed=info.get("step") or 0)

    def _plain(self, label: str, info: dict) -> None:
        stage_changed = label.split(" (")[0].split(":")[0] != (self._last_label or "").split(" (")[0].split(":")[0]
        now = time.monotonic()
        in_training = info.get("step") is not None
        if (not in_training and stage_changed) or (in_training and now - self._last_print >= 5.0):
            steps = f"/{info['steps']}" if in_training and info.get("steps") else ""
            print(
                f"gpudoctor smoke: {label if not in_training else 'step ' + str(info['step']) + steps}",
                file=sys.stderr,
                flush=True,
            )
            self._last_print = now
        self._last_label = label

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
