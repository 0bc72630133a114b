"""Which shell reader reads batch scripts: tree-sitter-bash or gpudoctor's own lexer (issue 9).

    python benchmarks/bench_sbatch_reader.py [--tree-sitter-path DIR]

Measures, each in a fresh interpreter: the import cost (gpudoctor's: on top of gpudoctor.facts, which every
`check` loads), the time to read every batch-script fixture
(tests/fixtures/sbatch), and whether each reader splits the tricky cases of issue 10 into the commands
bash runs, with every expansion kept as one word. --tree-sitter-path: where the `tree-sitter` and
`tree-sitter-bash` wheels are installed (pip install --target DIR tree-sitter tree-sitter-bash);
without it only gpudoctor's reader is measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "sbatch").rglob("*.slurm"))

# (name, script, the commands bash runs: [start line, [words as written]])
CASES = [
    (
        "backslash-space-comment",
        "python t.py \\\n  a=gpu \\    # use GPU\n  b.num_nodes=1\n",
        [[1, ["python", "t.py", "a=gpu", "\\ "]], [3, ["b.num_nodes=1"]]],
    ),
    (
        "command-substitution",
        "torchrun --rdzv_endpoint=$(hostname):29500 train.py\n",
        [[1, ["torchrun", "--rdzv_endpoint=$(hostname):29500", "train.py"]]],
    ),
    (
        "parameter",
        "torchrun --rdzv_endpoint=${head_node}:29500 train.py\n",
        [[1, ["torchrun", "--rdzv_endpoint=${head_node}:29500", "train.py"]]],
    ),
    ("array", 'srun "${CMD[@]}" --x\n', [[1, ["srun", '"${CMD[@]}"', "--x"]]]),
    (
        "arithmetic",
        "torchrun --nnodes=$((SLURM_NNODES * 2)) t.py\n",
        [[1, ["torchrun", "--nnodes=$((SLURM_NNODES * 2))", "t.py"]]],
    ),
    (
        "nested-substitution",
        'srun python t.py --ip="$(getent hosts $(hostname) | cut -d" " -f1)"\n',
        [[1, ["srun", "python", "t.py", '--ip="$(getent hosts $(hostname) | cut -d" " -f1)"']]],
    ),
    ("hash-inside-word", "srun python t.py --tag=a#b # note\n", [[1, ["srun", "python", "t.py", "--tag=a#b"]]]),
    (
        "heredoc",
        "cat > x.py <<'EOF'\nsrun python never.py\nEOF\nsrun python t.py\n",
        [[1, ["cat"]], [4, ["srun", "python", "t.py"]]],
    ),
    (
        "continuations-and-operators",
        "module load x && \\\n  srun python t.py; echo done\n",
        [[1, ["module", "load", "x"]], [2, ["srun", "python", "t.py"]], [2, ["echo", "done"]]],
    ),
]

GPUDOCTOR = """
import json, sys, time
import gpudoctor.facts, gpudoctor.readers.slurmfmt  # loaded by every `check` anyway: not this reader's cost
t0 = time.perf_counter()
from gpudoctor.readers.sbatch import parse_sbatch
from gpudoctor.readers.sbatch.shell import commands, tokenize
t1 = time.perf_counter()
texts = [open(p).read() for p in sys.argv[1:]]
start = time.perf_counter()
for _ in range(REPEAT):
    for text in texts:
        commands(tokenize(text))
t2 = time.perf_counter()
for _ in range(REPEAT):
    for text, p in zip(texts, sys.argv[1:]):
        parse_sbatch(text, p)
t3 = time.perf_counter()
cases = {}
for name, text, _ in CASES:
    src_lines = [0] + [i + 1 for i, c in enumerate(text) if c == "\\n"]
    line = lambda off: sum(1 for s in src_lines if s <= off)
    cases[name] = [[line(c.start), [w.text for w in c.words]] for c in commands(tokenize(text))]
print(json.dumps({"import_s": t1 - t0, "split_s": (t2 - start) / REPEAT, "read_s": (t3 - t2) / REPEAT, "cases": cases}))
"""

TREE_SITTER = """
import json, sys, time
sys.path.insert(0, TS_PATH)
t0 = time.perf_counter()
import tree_sitter, tree_sitter_bash
parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))
t1 = time.perf_counter()
data = [open(p, "rb").read() for p in sys.argv[1:]]
start = time.perf_counter()
for _ in range(REPEAT):
    for d in data:
        parser.parse(d)
t2 = time.perf_counter()
SKIP = {"file_redirect", "heredoc_redirect", "herestring_redirect", "comment"}
def cmds(tree):
    out, stack = [], [tree.root_node]
    while stack:
        n = stack.pop()
        if n.type == "command":
            out.append([n.start_point[0] + 1, [c.text.decode() for c in n.children if c.type not in SKIP]])
            continue
        if n.type in ("command_substitution", "heredoc_body"):
            continue
        stack.extend(reversed(n.children))
    return out
cases = {name: cmds(parser.parse(text.encode())) for name, text, _ in CASES}
print(json.dumps({"import_s": t1 - t0, "split_s": (t2 - start) / REPEAT, "read_s": None, "cases": cases}))
"""


ADVERSARIAL = """
import json, time
from gpudoctor.readers.sbatch import SbatchError, parse_sbatch
inputs = {
    "23 lines of X=$X$X": "#!/bin/bash\\nX=ab\\n" + "X=$X$X\\n" * 23 + "srun python t.py $X\\n",
    "100k assignment lines": (
        "#!/bin/bash\\n" + "".join(f"V{i}=$V{i - 1}x\\n" for i in range(100_000)) + "srun python t.py\\n"
    ),
    "one 3 MB word": "#!/bin/bash\\nsrun python t.py " + "a" * 3_000_000 + "\\n",
    "1500 nested wrapper words": "#!/bin/bash\\nsrun " + "env " * 1500 + "uv run " * 1500 + "python t.py\\n",
    "1500 nested $(": "#!/bin/bash\\nsrun python t.py " + "$(" * 1500 + ")" * 1500 + "\\n",
    "5000-digit --ntasks": "#!/bin/bash\\n#SBATCH --ntasks=" + "9" * 5000 + "\\nsrun python t.py\\n",
}
out = {}
for name, text in inputs.items():
    start = time.perf_counter()
    try:
        parse_sbatch(text, "job.slurm")
        result = "read"
    except SbatchError:
        result = "SbatchError (exit 2)"
    out[name] = [time.perf_counter() - start, result]
print(json.dumps(out))
"""


def run(code: str, repeat: int) -> dict:
    prelude = f"CASES = {CASES!r}\nREPEAT = {repeat}\n"
    out = subprocess.run(
        [sys.executable, "-c", prelude + code, *map(str, FIXTURES)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree-sitter-path")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    readers = {"gpudoctor shell.py": GPUDOCTOR}
    if args.tree_sitter_path:
        readers["tree-sitter-bash"] = TREE_SITTER.replace("TS_PATH", repr(args.tree_sitter_path))
    machine = f"{platform.node()} · {platform.machine()} · {platform.platform()}"
    print(f"machine: {machine} · Python {platform.python_version()}")
    print(
        f"fixtures: {len(FIXTURES)} batch scripts, {sum(p.stat().st_size for p in FIXTURES)} bytes; {args.runs} fresh "
        f"processes each, median\n"
    )
    print("| reader | import + set-up ms | split all fixtures ms | full read (BatchScript) ms | tricky cases as bash |")
    print("|---|---|---|---|---|")
    for name, code in readers.items():
        results = [run(code, args.repeat) for _ in range(args.runs)]
        med = {
            k: statistics.median(r[k] for r in results) if results[0][k] is not None else None
            for k in ("import_s", "split_s", "read_s")
        }
        cases = results[0]["cases"]
        right = [n for n, _, want in CASES if cases[n] == want]
        wrong = [f"{n}: {cases[n]}" for n, _, want in CASES if cases[n] != want]
        full = f"{med['read_s'] * 1000:.1f}" if med["read_s"] is not None else "n/a"
        times = f"{med['import_s'] * 1000:.1f} | {med['split_s'] * 1000:.2f} | {full}"
        print(f"| {name} | {times} | {len(right)}/{len(CASES)} |")
        for w in wrong:
            print(f"  differs: {w}", file=sys.stderr)
    print("\n| adversarial input (issue 13) | gpudoctor reader s | result |")
    print("|---|---|---|")
    adversarial = [run(ADVERSARIAL, 1) for _ in range(3)]
    for name in adversarial[0]:
        print(f"| {name} | {statistics.median(a[name][0] for a in adversarial):.3f} | {adversarial[0][name][1]} |")


if __name__ == "__main__":
    main()
