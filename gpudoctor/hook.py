"""`gpudoctor-hook sbatch|config FILE...`: the pre-commit hooks' entry (.pre-commit-hooks.yaml).

pre-commit passes many staged files in one call. Each is judged as `gpudoctor check --sbatch F` (or
`--config F`) would judge it before submission -- torch-free (inputs.probes_torch), its problems printed as
`path:line: GD-ID message` (--format concise) -- and the hook exits with the worst status: 1 when any
verdict fails, 2 when any file cannot be read as one (sbatch would refuse it too); a non-zero status
blocks the commit. Files that are not batch scripts are passed over: pre-commit cannot select by content,
so the sbatch hook receives every text file and keeps those whose name (.slurm, .sbatch) or first lines
(an `#SBATCH` line, as sbatch reads them) say SLURM.
"""

from __future__ import annotations

import sys

BATCH_SUFFIXES = (".slurm", ".sbatch")
HEAD_BYTES = 8192  # sbatch reads directives only above the first command, near the top


def is_batch_script(path: str) -> bool:
    if path.endswith(BATCH_SUFFIXES):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return False
    return any(line.startswith(b"#SBATCH") for line in head.splitlines())


def main(argv: list[str] | None = None) -> int:
    from gpudoctor.cli import main as gpudoctor
    from gpudoctor.cli import stdout_usable

    if not stdout_usable():
        return 2
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("sbatch", "config"):
        print("gpudoctor-hook: usage: gpudoctor-hook sbatch|config [CHECK OPTIONS] FILE...", file=sys.stderr)
        return 2
    kind, rest = args[0], args[1:]
    options = [a for a in rest if a.startswith("-")]  # e.g. --strict, --select=slurm (hook `args:`)
    files = [a for a in rest if not a.startswith("-")]
    if kind == "config":
        # A config alone judges this machine (job.target.decide); with the GPU count stated and
        # --before-submission it is a job judged before submission, also on a GPU workstation, so the
        # committer's machine (its driver, its torch) stays out of the verdict.
        if not any(o.startswith("--expect-gpus") for o in options):
            options += ["--expect-gpus", "1"]
        options.append("--before-submission")
    worst = 0
    for path in files:
        if kind == "sbatch" and not is_batch_script(path):
            continue
        code = gpudoctor(["check", f"--{kind}", path, "--format", "concise", *options])
        worst = max(worst, code)
    sys.stdout.flush()
    return worst


if __name__ == "__main__":
    sys.exit(main())
