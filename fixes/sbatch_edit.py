"""Structured edits of a batch script's text: #SBATCH options, exports, the launch line.

Every edit is anchored on the source spans of gpudoctor's own reader (readers/sbatch: the typed
BatchScript, read the way sbatch and bash read the script): a directive is the one sbatch uses
for the canonical option (`-n`, `--ntasks`, `--ntask` all name `ntasks`), an export is the
assignment the reader saw, the launch line is the one the reader picked as the training launch.
The text is re-read before each edit, so spans always belong to the text being changed; line
numbers never decide what changes. Untouched bytes stay as they are (line endings, comments).

Each function takes the script text and returns the new text, or raises EditError when the edit
cannot be made safely (the fix is then reported as not applied, with the reason).
"""

from __future__ import annotations

import re
import shlex

from gpudoctor import shellquote
from gpudoctor.readers import sbatch as reader


class EditError(ValueError):
    """An edit that cannot be anchored in the text: the fix is skipped with this reason."""


def _parse(text: str):
    try:
        return reader.reparse_sbatch(text)
    except reader.SbatchError as e:
        raise EditError(f"the script does not read: {e}") from None


def _single(script) -> None:
    if script.het_components > 1:
        raise EditError("a heterogeneous job (#SBATCH hetjob): its directives are edited by hand")


def _line_bounds(text: str, pos: int) -> tuple[int, int]:
    """(start, end) of the physical line holding pos; end includes its line break."""
    start = text.rfind("\n", 0, pos) + 1
    nl = text.find("\n", pos)
    return start, (len(text) if nl < 0 else nl + 1)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _directive_value(value: object) -> str:
    """A `#SBATCH --option=VALUE` value: bare where sbatch reads it so, else single-quoted (sbatch's directive
    parser strips the quotes). A line break or other control character cannot be in a directive (it would end
    the comment and start a line bash runs), nor a byte that is not UTF-8: refused."""
    text = str(value)
    if any(shellquote.unprintable(ch) for ch in text):
        raise EditError(f"the value {shellquote.shown(text)} cannot be written into an #SBATCH line")
    return text if re.fullmatch(r"[A-Za-z0-9_:.,/%@+=\-\[\]]+", text) else shlex.quote(text)


def set_directive(text: str, option: str, value: object) -> str:
    """Set `#SBATCH --option=value`: the directive sbatch uses (the last) is edited in place, keeping its
    spelling and comment; else a new line goes under the last directive."""
    if value is None:
        return remove_directive(text, option)
    script = _parse(text)
    _single(script)
    option = reader.canonical(option) or option
    new = _directive_value(value)
    d = script.directive(option)
    if d is not None:
        if d.value_span is None:  # a flag: write the long form with the value
            return text[: d.span.start] + f"--{option}={new}" + text[d.span.end :]
        return text[: d.value_span.start] + new + text[d.value_span.end :]
    if script.directives:
        at = _line_bounds(text, script.directives[-1].line_span.start)[1]
    else:  # under the #! line
        at = _line_bounds(text, 0)[1]
    return text[:at] + f"#SBATCH --{option}={new}\n" + text[at:]


def remove_directive(text: str, option: str) -> str:
    """Drop every occurrence of an #SBATCH option sbatch reads. A line left without options is deleted,
    or, when it carried the user's comment, kept as a comment saying what was removed."""
    option = reader.canonical(option) or option
    for _ in range(64):  # one occurrence per pass: spans are re-read after each change
        script = _parse(text)
        _single(script)
        hits = [d for d in script.directives if d.option == option]
        if not hits:
            return text
        d = hits[-1]
        others = [o for o in script.directives if o.line == d.line and o is not d]
        if others:
            tail = text[d.span.end :]
            text = (
                text[: d.span.start].rstrip(" \t")
                + (" " if tail.lstrip(" \t")[:1] not in ("\n", "") else "")
                + tail.lstrip(" \t")
            )
            continue
        start, end = _line_bounds(text, d.line_span.start)
        line = text[start:end]
        if "#" in line[len("#SBATCH") :]:
            text = text[:start] + f"# removed by gpudoctor fix: {line.strip()}\n" + text[end:]
        else:
            text = text[:start] + text[end:]
    raise EditError(f"--{option} is given too often to remove")


def rename_option(text: str, written: str, meant: str) -> str:
    """`#SBATCH --ntask-per-node=8` -> `#SBATCH --ntasks-per-node=8`: an option sbatch does not know (the reader's
    unknown directives) renamed to the one meant, its value and the line's comment kept."""
    script = _parse(text)
    _single(script)
    name = written.split("=", 1)[0]
    for u in script.unknown_directives:
        if not any(o.split("=", 1)[0] == name for o in u.options):
            continue
        line = text[u.span.start : u.span.end]
        m = re.search(rf"(?<!\S){re.escape(name)}(?=[=\s]|$)", line)
        if m:
            at = u.span.start + m.start()
            return text[:at] + f"--{meant}" + text[at + len(name) :]
    raise EditError(f"no #SBATCH line with {name}")


def repair_continuation(text: str, line_text: str) -> str:
    """`arg \\    # note` -> `arg \\`: nothing after the backslash, so it continues the command again; the
    comment moves to a line of its own above the command (a comment cannot sit inside a continued command)."""
    script = _parse(text)
    broken = next((b for b in script.broken_continuations if b.text == line_text), None)
    if broken is None:
        raise EditError(f"no line {line_text.strip()!r} that ends with a backslash and blanks")
    start, end = _line_bounds(text, broken.backslash.start)
    after = text[broken.backslash.end : end].strip()
    text = text[: broken.backslash.start] + "\\" + text[end - (1 if text[end - 1 : end] == "\n" else 0) :]
    if not after:
        return text
    # the first line of the command: walk up while the line above ends with a backslash-newline
    first = start
    while first > 0:
        above = text.rfind("\n", 0, first - 1) + 1
        if not text[above : first - 1].endswith("\\"):
            break
        first = above
    indent = _indent(text[first:end])
    return text[:first] + f"{indent}{after}\n" + text[first:]


def hoist_directive(text: str, directive: str) -> str:
    """Move an #SBATCH line from below the first command (where sbatch ignores it) under the last directive."""
    script = _parse(text)
    _single(script)
    wanted = directive.strip()
    late = next((d for d in script.late_directives if d.text.strip() == wanted), None)
    if late is None:
        raise EditError(f"no line {wanted!r} below the first command")
    start, end = _line_bounds(text, late.span.start)
    line = text[start:end] if text[start:end].endswith("\n") else text[start:end] + "\n"
    text = text[:start] + text[end:]
    script = _parse(text)
    at = _line_bounds(text, script.directives[-1].line_span.start)[1] if script.directives else _line_bounds(text, 0)[1]
    return text[:at] + line + text[at:]


def repair_directive(text: str, line_text: str) -> str:
    """`!#SBATCH --signal=USR1@90`, `# SBATCH ...`, `#SBATCh ...`, `  #SBATCH ...` -> `#SBATCH ...`: the marker of a
    header line that looks like a directive (the reader's lookalike_directives) rewritten, its options and comment
    kept as written."""
    script = _parse(text)
    _single(script)
    found = next((la for la in script.lookalike_directives if la.text == line_text and la.repairable), None)
    if found is None:
        raise EditError(f"no header line {line_text.strip()!r} that looks like an #SBATCH directive")
    return text[: found.marker.start] + "#SBATCH" + text[found.marker.end :]


# ---------------------------------------------------------------- the launch line and exports


def _launch(text: str):
    script = _parse(text)
    if script.launch is None:
        raise EditError("no training launch line found in the script")
    return script, script.launch


_LEADING = re.compile(r"^((?:(?:exec|time|nohup|command)\s+)*)")


def prefix_srun(text: str, options: str = "") -> str:
    """Put `srun [options]` in front of the launch command (after `exec`/`time`); a no-op if it has srun."""
    _, launch = _launch(text)
    if launch.srun is not None:
        return text
    leading = _LEADING.match(text[launch.span.start : launch.span.end])
    at = launch.span.start + (leading.end() if leading else 0)
    insert = "srun " + (options.strip() + " " if options and options.strip() else "")
    return text[:at] + insert + text[at:]


def set_export(text: str, name: str, value: object) -> str:
    """`export NAME=value`: the launch command's own `NAME=value` if it has one, else the last assignment before
    the launch is edited (where it is exported, or a
    plain assignment that a later export makes an export), else a new export goes directly before the
    launch line (with its indentation)."""
    if not shellquote.is_name(name):
        raise EditError(f"{shellquote.shown(name)} is not a shell variable name")
    script, launch = _launch(text)
    try:
        new = shellquote.quote(value if isinstance(value, str) else str(value))  # a Reference stays live
    except ValueError as e:
        raise EditError(f"{name}: {e}") from None
    own = [a for a in launch.env if a.name == name and not a.unset and a.value_span is not None]
    if own:  # `NAME=value srun ...`: the launch's own value wins over any export, so it is the one to edit
        span = own[-1].value_span
        return text[: span.start] + new + text[span.end :]
    before = [a for a in script.assignments if a.name == name and a.span.end <= launch.span.start]
    exported = name in script.exports and not script.exports[name].unset
    last = before[-1] if before else None
    if last is not None and not last.unset and last.value_span is not None and (last.exported or exported):
        return text[: last.value_span.start] + new + text[last.value_span.end :]
    start, _ = _line_bounds(text, launch.span.start)
    indent = _indent(text[start : launch.span.start])
    return text[:start] + f"{indent}export {name}={new}\n" + text[start:]


def remove_export(text: str, name: str, inherited: bool = False) -> str:
    """Drop the `export NAME=...` assignments before the launch (a comment on the line stays, saying what
    was removed); with inherited (the submitting shell sets it and sbatch passes it on), also put
    `unset NAME` before the launch line."""
    changed = False
    for _ in range(64):
        script, launch = _launch(text)
        hits = [a for a in script.assignments if a.name == name and not a.unset and a.span.end <= launch.span.start]
        if not hits:
            break
        a = hits[-1]
        changed = True
        together = [o for o in script.assignments if o.span == a.span and o is not a]
        if together and a.value_span is not None:  # `export A=1 B=2`: drop this word only
            word_start = a.value_span.start - len(name) - 1
            tail = text[a.value_span.end :].lstrip(" \t")
            text = text[:word_start].rstrip(" \t") + ("" if tail[:1] in ("\n", ";", "#", "") else " ") + tail
            continue
        start, end = _line_bounds(text, a.span.start)
        line = text[start:end]
        rest = line[a.span.end - start :].strip()
        if rest.startswith("#"):
            text = text[:start] + f"{_indent(line)}# removed by gpudoctor fix: {line.strip()}\n" + text[end:]
        elif not rest and not line[: a.span.start - start].strip():
            text = text[:start] + text[end:]
        else:
            raise EditError(f"line {a.line} holds more than the export of {name}: edit it by hand")
    # `NAME=value srun ...` / `env NAME=value ...`: the launch command's own assignment goes too
    _, launch = _launch(text)
    spans = {a.value_span.start: a.value_span for a in launch.env if a.name == name and a.value_span and not a.unset}
    for value_span in sorted(spans.values(), key=lambda sp: -sp.start):
        word_start = value_span.start - len(name) - 1
        text = text[:word_start] + text[value_span.end :].lstrip(" \t")
        changed = True
    if inherited:
        _, launch = _launch(text)
        start, _ = _line_bounds(text, launch.span.start)
        if not shellquote.is_name(name):
            raise EditError(f"{shellquote.shown(name)} is not a shell variable name")
        text = text[:start] + f"{_indent(text[start : launch.span.start])}{shellquote.unset(name)}\n" + text[start:]
    elif not changed:
        raise EditError(f"no `export {name}=...` before the launch line")
    return text


def set_override(text: str, key: str, value: object) -> str:
    """Set a value given on the launch line: a Hydra/OmegaConf `key=value` (also `+key`/`++key`) or a
    `--flag value` / `--flag=value` argument. EditError when the launch line does not give it."""
    _, launch = _launch(text)
    region = text[launch.span.start : launch.span.end]
    try:
        new = shellquote.quote(str(value))  # a word of the launch line: its bytes, never an expansion or glob
    except ValueError as e:
        raise EditError(f"{key}: {e}") from None
    hydra = re.compile(rf"(?<![\w.+-])(\+{{0,2}}{re.escape(key)}=)(\"[^\"]*\"|'[^']*'|[^\s\\]*)")
    m = hydra.search(region)
    if m is None:
        for flag in _flag_spellings(key):
            m = re.search(rf"(?<!\S){re.escape(flag)}(=|\s+)(\"[^\"]*\"|'[^']*'|[^\s\\]+)", region)
            if m:
                break
    if m is None:
        raise EditError(f"the launch line does not set {key}")
    at = launch.span.start
    return text[: at + m.start(2)] + new + text[at + m.end(2) :]


def _flag_spellings(key: str) -> list[str]:
    """A launcher option's spellings (`nproc_per_node`: --nproc_per_node, --nproc-per-node); a dotted config key's
    jsonargparse spellings (--data.num_workers; --model.lr for model.init_args.lr). A config key is never
    matched to a plain `--leaf` option of the program: what that sets is in the program's code."""
    if "." in key:
        return sorted({f"--{key}", f"--{key.replace('.init_args.', '.')}"})
    return sorted({f"--{key}", f"--{key.replace('_', '-')}", f"--{key.replace('-', '_')}"})


def override_on_launch(text: str, key: str, config: dict | None = None) -> bool:
    """The launch line decides this config key by a known rule (Hydra `key=`/`+key=`/`++key=`, jsonargparse
    `--a.b`), as readers/overrides reads it for `check`: then the line, not the config file, is edited."""
    from gpudoctor.readers.overrides import launch_overrides
    from gpudoctor.readers.sbatch import SbatchError, reparse_sbatch

    try:
        overrides = launch_overrides(reparse_sbatch(text))
    except SbatchError:
        return False
    found = overrides.setting(key, config) if overrides else None
    return found is not None and found.op != "delete"
