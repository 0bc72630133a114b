"""`bash -n` over a batch script: the one reading of a script that runs a program (the readers run nothing).

`gpudoctor.readers.sbatch.load_sbatch(path, check_syntax=bash_syntax)` records the answer in
BatchScript.bash_syntax, which GD-SLURM-014 judges; `fix` asks again for each edited text.
"""

from __future__ import annotations

import functools
import os
import re

from gpudoctor.readers.sbatch.script import BashSyntax
from gpudoctor.redact import redact

BASH_TIMEOUT_S = 5.0
_SHELL_INTERPRETERS = {"bash", "sh"}
_CACHE = 4  # as the reader's parse cache: the last few texts `fix` reads again


def bash_syntax(text: str) -> BashSyntax:
    """`bash -n` over the script text (stdin), in its own process group, killed whole after BASH_TIMEOUT_S.
    The same text with the same bash gets the answer once (fix asks again for each edited text)."""
    import shutil

    return _bash_syntax(text, shutil.which("bash"), os.environ.get("PATH", "/usr/bin:/bin"), BASH_TIMEOUT_S)


@functools.lru_cache(maxsize=_CACHE)
def _bash_syntax(text: str, bash: str | None, path: str, timeout: float) -> BashSyntax:
    import subprocess

    from gpudoctor.probe.proc import run_bounded

    shebang = text.split("\n", 1)[0][2:].split()
    interpreter = os.path.basename(shebang[0]) if shebang else ""
    if interpreter == "env" and len(shebang) > 1:
        interpreter = os.path.basename(shebang[1])
    if interpreter not in _SHELL_INTERPRETERS:
        return BashSyntax(None, f"the script runs under {interpreter or 'an unnamed interpreter'}, not bash")
    if bash is None:
        return BashSyntax(None, "bash is not on PATH: the script's syntax was not checked")
    try:
        proc = run_bounded(
            [bash, "-n"],
            timeout,
            env={"PATH": path, "LC_ALL": "C"},
            input=text.encode("utf-8", errors="replace"),
            max_output=64 * 1024,
        )
    except subprocess.TimeoutExpired:
        return BashSyntax(None, f"bash -n did not finish within {timeout:g} s")
    except OSError as e:
        return BashSyntax(None, f"bash -n could not run ({e.strerror or e})")
    err = proc.stderr
    if proc.returncode == 0:
        return BashSyntax(True)
    lines = [redact(re.sub(r"^\S*bash: ", "", ln.strip())) for ln in err.splitlines() if ln.strip()]
    return BashSyntax(False, "; ".join(lines[:3])[:500] or f"bash -n exited {proc.returncode}")
