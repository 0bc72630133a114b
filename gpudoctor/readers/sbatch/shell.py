"""Reading shell text as bash reads it, without running it: words, commands, expansions, branches.

The lexer follows the token rules of the bash manual ("Shell Syntax": quoting, comments,
"Shell Expansions", "Redirections", "Here Documents"):

- a backslash-newline is removed (a line continuation); a backslash before any other character,
  a space included, quotes that character -- so `arg \\    # note` ends the command at the comment
  and the next line is a command of its own;
- `#` starts a comment only at the start of a word;
- '...', "...", $'...', `...`, $(...), $((...)), ${...} and array values NAME=(...) are one word part
  each, kept verbatim (nesting is tracked with an explicit stack: no recursion, any depth);
- ; & | && || ;; ( ) and newlines end a command; redirections and their targets are not words;
  here-document bodies are skipped.

Every word keeps its character offsets, which `Source.span()` turns into (line, column) spans.

Expansion is bounded (issue 13 B3): a value longer than MAX_VALUE becomes unknown, and once a
script has produced EXPANSION_BUDGET characters of expansions, the rest stays as written.
"""

from __future__ import annotations

import bisect
import re
from typing import NamedTuple

from gpudoctor.readers.ints import MAX_INT_DIGITS, small_int
from gpudoctor.readers.sbatch.script import Span

# ---------------------------------------------------------------- spans


class Source:
    """The script text with its line starts, to turn character offsets into spans."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def position(self, offset: int) -> tuple[int, int]:
        """(1-based line, 0-based column) of a character offset."""
        index = bisect.bisect_right(self._starts, offset) - 1
        return index + 1, offset - self._starts[index]

    def span(self, start: int, end: int) -> Span:
        line, column = self.position(start)
        end_line, end_column = self.position(end)
        return Span(line, column, end_line, end_column, start, end)

    def line_text(self, line: int) -> str:
        start = self._starts[line - 1]
        stop = self._starts[line] - 1 if line < len(self._starts) else len(self.text)
        return self.text[start:stop]


# ---------------------------------------------------------------- lexer


class Token(NamedTuple):
    kind: str  # "word" | "op" | "redir" | "newline" | "comment"
    text: str  # as written
    start: int
    end: int
    unterminated: bool = False  # a quote or $( ... left open at the end of the text


_OPERATORS = ("&&", "||", ";;&", ";;", ";&", "|&", ";", "&", "|", "(", ")")
_REDIRECTS = ("<<<", "<<-", "<<", ">>", ">&", "<&", "&>>", "&>", ">|", "<>", ">", "<")
_WORD_END = frozenset(" \t\n;&|<>()")
# Characters that can change the lexer's state; everything else is copied in one step.
_SPECIAL = re.compile(r"[\s;&|<>()'\"\\$`{}#]")
_ARRAY_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=$")
_OPERATOR_START = frozenset("0123456789{;&|()<>")
# An operator or a redirection (with its file-descriptor prefix: 2>&1, {fd}>file) at a position.
_OPERATOR_AT = re.compile(
    r"(?:\d+|\{[A-Za-z_][A-Za-z0-9_]*\})?(?P<redir>" + "|".join(re.escape(r) for r in _REDIRECTS) + ")"
    r"|(?P<op>" + "|".join(re.escape(o) for o in _OPERATORS) + ")"
)


# scan_word's state table. A construct ends at its closing character (_CLOSED_BY); any other special character
# inside it goes to its step (_INSIDE), which returns where scanning goes on, _WORD_ENDS, or None: the character
# may open a construct (_open). `...` and ${...} have no step: inside them only openers count.
_CLOSED_BY = {'"': '"', "`": "`", "$(": ")", "(": ")", "${": "}", "$'": "'"}
_WORD_ENDS = -1


def _in_plain_word(text: str, i: int, c: str, stack: list[str], word_start: int) -> int | None:
    if c not in _WORD_END:
        return None
    if c == "(" and _ARRAY_START.fullmatch(text, word_start, i):  # NAME=( ... ): an array's words
        stack.append("(")
        return i + 1
    return _WORD_ENDS


def _in_double_quotes(text: str, i: int, c: str, stack: list[str], word_start: int) -> int | None:
    return None if c in "$`" else i + 1  # only expansions are live inside "..."


def _in_parentheses(text: str, i: int, c: str, stack: list[str], word_start: int) -> int | None:
    """$( ... ) and the ( ... ) nested in it or in an array: parentheses count, a comment runs to the line end."""
    if c == "(":
        stack.append("(")
        return i + 1
    if c == "#" and i > 0 and text[i - 1] in " \t\n":
        nl = text.find("\n", i)
        return len(text) if nl < 0 else nl
    return None


def _in_ansi_c_quotes(text: str, i: int, c: str, stack: list[str], word_start: int) -> int | None:
    return i + 1  # $'...': nothing opens inside (a backslash escape is skipped before)


_INSIDE = {
    None: _in_plain_word,
    '"': _in_double_quotes,
    "$(": _in_parentheses,
    "(": _in_parentheses,
    "$'": _in_ansi_c_quotes,
}
# The constructs a character opens, in every context but single quotes; ' and $' are literal inside "...".
_OPENERS = {"'": ("'",), '"': ('"',), "`": ("`",), "$": ("$'", "$(", "${")}
_LITERAL_IN_DOUBLE_QUOTES = ("'", "$'")


def _open(text: str, i: int, c: str, stack: list[str]) -> int:
    """Past the construct opened at i (pushed on the stack), or past the one character when it opens none."""
    in_double_quotes = bool(stack) and stack[-1] == '"'
    for opener in _OPENERS.get(c, ()):
        if text.startswith(opener, i) and not (in_double_quotes and opener in _LITERAL_IN_DOUBLE_QUOTES):
            stack.append(opener)
            return i + len(opener)
    return i + 1


def scan_word(text: str, i: int, single: bool = False) -> tuple[int, bool]:
    """The end of the word starting at i, and whether a quote or expansion was left open.

    single: only the one quote or expansion that starts at i. One explicit stack of open
    constructs, so nesting depth costs memory, not recursion; each character is looked at a
    bounded number of times (a state table: _CLOSED_BY, _INSIDE), so the time is linear in the text.
    """
    n = len(text)
    word_start = i
    stack: list[str] = []
    while i < n:
        if single and not stack and i > word_start:
            return i, False
        top = stack[-1] if stack else None
        if top == "'":  # nothing is special in single quotes but the closing one
            close = text.find("'", i)
            if close < 0:
                return n, True
            stack.pop()
            i = close + 1
            continue
        m = _SPECIAL.search(text, i)
        if m is None:
            return n, bool(stack)
        i = m.start()
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if top is not None and c == _CLOSED_BY[top]:
            stack.pop()
            i += 1
            continue
        step = _INSIDE.get(top)
        after = step(text, i, c, stack, word_start) if step is not None else None
        if after == _WORD_ENDS:
            return i, False
        i = _open(text, i, c, stack) if after is None else after
    return n, bool(stack)


def tokenize(text: str) -> list[Token]:
    """The tokens of shell text, with here-document bodies skipped."""
    out: list[Token] = []
    pending_heredocs: list[tuple[str, bool]] = []  # (delimiter, strip leading tabs)
    expect_heredoc_word = False
    strip_tabs = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
            continue
        if c == "\\" and text.startswith("\\\n", i):
            i += 2
            continue
        if c == "\n":
            out.append(Token("newline", "\n", i, i + 1))
            i += 1
            if pending_heredocs:
                i = _skip_heredocs(text, i, pending_heredocs)
                pending_heredocs = []
            continue
        if c == "#":
            nl = text.find("\n", i)
            end = n if nl < 0 else nl
            out.append(Token("comment", text[i:end], i, end))
            i = end
            continue
        m = _OPERATOR_AT.match(text, i) if c in _OPERATOR_START else None
        if m and m.group("redir"):
            out.append(Token("redir", m.group(0), i, m.end()))
            i = m.end()
            if m.group("redir") in ("<<", "<<-"):
                expect_heredoc_word, strip_tabs = True, m.group("redir") == "<<-"
            continue
        if m and m.group("op"):
            out.append(Token("op", m.group("op"), i, m.end()))
            i = m.end()
            continue
        end, open_ = scan_word(text, i)
        end = max(end, i + 1)
        out.append(Token("word", text[i:end], i, end, open_))
        if expect_heredoc_word:
            pending_heredocs.append((unquote(text[i:end]), strip_tabs))
            expect_heredoc_word = False
        i = end
    return out


def _skip_heredocs(text: str, i: int, heredocs: list[tuple[str, bool]]) -> int:
    """The offset after the bodies of the here-documents opened on the line that just ended."""
    for delimiter, strip_tabs in heredocs:
        while i < len(text):
            nl = text.find("\n", i)
            end = len(text) if nl < 0 else nl
            line = text[i:end]
            i = end + 1
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                break
    return min(i, len(text))


class Command(NamedTuple):
    """A simple command: its words (redirections left out) and where it sits."""

    words: tuple[Token, ...]
    start: int
    end: int


_SEPARATORS = frozenset(_OPERATORS)


def commands(tokens: list[Token]) -> list[Command]:
    """Tokens grouped into simple commands, split at operators and newlines."""
    out: list[Command] = []
    words: list[Token] = []
    start: int | None = None
    end: int | None = None
    skip_target = False
    for tok in tokens:
        if tok.kind == "word":
            if start is None:
                start = tok.start
            end = tok.end
            if skip_target:
                skip_target = False
                continue
            words.append(tok)
        elif tok.kind == "redir":
            if start is None:
                start = tok.start
            end = tok.end
            skip_target = True
        elif tok.kind in ("newline", "op"):
            if words and start is not None and end is not None:
                out.append(Command(tuple(words), start, end))
            words, start, end, skip_target = [], None, None, False
    if words and start is not None and end is not None:
        out.append(Command(tuple(words), start, end))
    return out


def split_commands(text: str) -> list[list[str]]:
    """Shell text -> its simple commands as lists of words after quote removal."""
    return [[unquote(w.text) for w in cmd.words] for cmd in commands(tokenize(text))]


# ---------------------------------------------------------------- quote removal

_UNQUOTE_SPECIAL = re.compile(r"[\\'\"$`]")
_DQ_ESCAPABLE = frozenset('$`"\\\n')


def unquote(word: str) -> str:
    """Quote removal (bash manual 3.5.9); $(...), ${...} and `...` are kept exactly as written."""
    out: list[str] = []
    i, n = 0, len(word)
    in_double = False
    while i < n:
        m = _UNQUOTE_SPECIAL.search(word, i)
        if m is None:
            out.append(word[i:])
            break
        out.append(word[i : m.start()])
        i = m.start()
        c = word[i]
        if c == "\\":
            nxt = word[i + 1 : i + 2]
            if nxt == "\n":
                pass
            elif in_double and nxt not in _DQ_ESCAPABLE:
                out.append("\\" + nxt)
            else:
                out.append(nxt)
            i += 2
        elif c == '"':
            in_double = not in_double
            i += 1
        elif c == "'" and not in_double:
            close = word.find("'", i + 1)
            close = n if close < 0 else close
            out.append(word[i + 1 : close])
            i = close + 1
        elif c == "$" and word.startswith("$'", i) and not in_double:
            end, _ = scan_word(word, i, single=True)
            body = word[i + 2 : end - 1] if end > i + 2 else ""
            out.append(_ansi_c(body))
            i = end if end > i else i + 2
        elif c == "$" and word.startswith(("$(", "${"), i) or c == "`":
            end = _construct_end(word, i)
            out.append(word[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _construct_end(word: str, i: int) -> int:
    """The end of the $(...), ${...} or `...` starting at i (the word's end when left open)."""
    end, _ = scan_word(word, i, single=True)
    return max(end, i + 1)


_ANSI = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"', "a": "\a", "r": "\r", "e": "\x1b", "E": "\x1b"}


def _ansi_c(body: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ANSI.get(m.group(1), "\\" + m.group(1)), body)


# ---------------------------------------------------------------- expansion

MAX_VALUE = 64 * 1024  # a variable longer than this is unknown (bash would hold it; no launch line needs it)
EXPANSION_BUDGET = 8 * 1024 * 1024  # characters produced by expansions over one script

# A name, or a positional/special parameter ($1, ${10}, $@, $*, $#): bash(1) "PARAMETERS", "Positional Parameters".
_VAR = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#])(\[[@*]\])?(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*|\d|[@*#]))"
)
# The script's arguments ($1 ... $9, ${10}..., "$@", "$*", "$#"): what `sbatch job.slurm ARGS` passes. A shell
# started inside the script (`bash -c '...'`) has its own, so they are never expanded in a deferred segment.
POSITIONAL = frozenset({*map(str, range(100)), "@", "*", "#"})


def is_script_argument(name: str) -> bool:
    return name in POSITIONAL and name != "0"


_ARITH = re.compile(r"\$\(\(([^()]*)\)\)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ARITH_OK = re.compile(r"[\d\s+\-*/%()]+")


class Expander:
    """$X, ${X}, ${X:-default}, "${ARR[@]}" and integer $((...)) from the variables known.

    Unknown names stay as written. `skip` names (the per-task SLURM variables) are not expanded in
    single quotes or after a backslash: each task's own shell expands them later.
    """

    def __init__(self, budget: int = EXPANSION_BUDGET) -> None:
        self.budget = budget

    def expand(self, text: str, known: dict[str, str], deferred_skip: frozenset[str] = frozenset()) -> str:
        if self.budget <= 0:
            return text
        out = []
        for piece, deferred in _deferred_segments(text):
            out.append(self._expand(piece, known, deferred_skip if deferred else frozenset()))
        result = "".join(out)
        self.budget -= max(0, len(result) - len(text))
        return result

    def _expand(self, text: str, known: dict[str, str], skip: frozenset[str]) -> str:
        if "$" not in text:
            return text
        text = _ARITH.sub(lambda m: arithmetic(m.group(1), known, skip) or m.group(0), text)

        def sub(m: re.Match) -> str:
            name = m.group(1) or m.group(4)
            if name in known and name not in skip:
                return known[name]
            if m.group(3) is not None and name not in POSITIONAL:
                return m.group(3)  # ${1:-x}: the argument may be given at submission; unknown, not the default
            return m.group(0)

        return _VAR.sub(sub, text)


_QUOTE_OR_ESCAPE = re.compile(r"[\\\"']")


def _deferred_segments(text: str) -> list[tuple[str, bool]]:
    """(piece, deferred): '...'-quoted text and \\$VAR are expanded later, by each task's own shell
    (`srun bash -c '... $SLURM_NODEID ...'`), not by the batch shell."""
    if "'" not in text and "\\" not in text:
        return [(text, False)]
    out: list[tuple[str, bool]] = []
    start, i, in_double = 0, 0, False
    n = len(text)
    while i < n:
        m = _QUOTE_OR_ESCAPE.search(text, i)
        if m is None:
            break
        i = m.start()
        c = text[i]
        if c == "\\" and text[i + 1 : i + 2] == "$":
            out.append((text[start:i], False))
            v = _VAR.match(text, i + 1)
            end = v.end() if v else i + 2
            out.append((text[i + 1 : end], True))  # the shell drops the backslash
            start = i = end
            continue
        if c == "\\":
            i += 2
            continue
        if c == '"':
            in_double = not in_double
        elif c == "'" and not in_double:
            close = text.find("'", i + 1)
            end = n if close < 0 else close + 1
            out.append((text[start:i], False))
            out.append((text[i:end], True))
            start = i = end
            continue
        i += 1
    out.append((text[start:], False))
    return [(piece, deferred) for piece, deferred in out if piece]


def arithmetic(expr: str, known: dict[str, str], skip: frozenset[str] = frozenset()) -> str | None:
    """$(( SLURM_NNODES * GPUS_PER_NODE )) -> '16' when every name is a known integer; else None."""
    if len(expr) > 200:
        return None
    lookup = {k: v for k, v in ((k, known.get(k)) for k in set(_NAME.findall(expr))) if v is not None and k not in skip}
    expr = _VAR.sub(lambda m: lookup.get(m.group(1) or m.group(4), m.group(0)), expr)
    expr = _NAME.sub(lambda m: lookup.get(m.group(0), m.group(0)), expr)
    if len(expr) > 200 or not _ARITH_OK.fullmatch(expr) or "**" in expr:
        return None
    if any(len(d) > MAX_INT_DIGITS for d in re.findall(r"\d+", expr)):
        return None
    try:
        value = eval(expr.replace("/", "//"), {"__builtins__": {}}, {})  # digits, + - * / % and parentheses only
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(value, int) or len(str(abs(value))) > MAX_INT_DIGITS:
        return None
    return str(value)


# ---------------------------------------------------------------- if / elif / else / fi

_INT_TESTS = {
    "-eq": int.__eq__,
    "-ne": int.__ne__,
    "-gt": int.__gt__,
    "-ge": int.__ge__,
    "-lt": int.__lt__,
    "-le": int.__le__,
}


def judge_test(words: list[str]) -> bool | None:
    """`[ 2 -gt 1 ]`, `[[ a == b ]]`, `test ...` on values known after expansion; None when it cannot be told."""
    if words[:1] in (["["], ["[["]) and words[-1:] in (["]"], ["]]"]):
        words = words[1:-1]
    elif words[:1] == ["test"]:
        words = words[1:]
    else:
        return None
    negate = words[:1] == ["!"]
    words = words[1:] if negate else words
    if len(words) != 3 or any("$" in w or "`" in w for w in (words[0], words[2])):
        return None
    a, op, b = words
    if op in _INT_TESTS:
        x, y = small_int(a), small_int(b)
        if x is None or y is None:
            return None
        result = _INT_TESTS[op](x, y)
    elif op in ("=", "==", "!=") and not any(c in a + b for c in "*?["):
        result = (a == b) == (op != "!=")
    else:
        return None
    return result != negate


class Branches:
    """if/elif/else/fi in the body: commands in a branch that cannot run for this job are skipped.

    A condition is judged only when it is a plain test of values known from the directives
    (`if [ "$SLURM_NNODES" -gt 1 ]` with --nodes=2); any other branch may run.
    """

    def __init__(self) -> None:
        self.frames: list[
            dict
        ] = []  # per open `if`: this branch runs (True/False/None), an earlier one surely/maybe ran
        self.condition_open = False  # the last command was `if`/`elif`: the next must be `then ...`

    @property
    def may_run(self) -> bool:
        return all(f["runs"] is not False for f in self.frames)

    def _enter(self, runs: bool | None) -> None:
        f = self.frames[-1]
        runs = False if f["taken"] else (None if f["maybe"] and runs is not False else runs)
        f.update(runs=runs, taken=f["taken"] or runs is True, maybe=f["maybe"] or runs is None)

    def feed(self, tokens: list[str]) -> list[str]:
        """The command without its if/then/else/fi keyword; [] when none is left."""
        word = tokens[0]
        if self.condition_open and word != "then" and self.frames:
            self.frames[-1].update(runs=None, taken=False, maybe=True)  # `if [ a ] && [ b ]`: not judged
        self.condition_open = word in ("if", "elif")
        if word == "if":
            self.frames.append({"runs": None, "taken": False, "maybe": False})
            self._enter(judge_test(tokens[1:]))
            return []
        if word == "elif" and self.frames:
            self._enter(judge_test(tokens[1:]))
            return []
        if word == "else" and self.frames:
            self._enter(True)
            return tokens[1:]
        if word == "fi":
            if self.frames:
                self.frames.pop()
            return []
        if word in ("then", "do", "{"):
            return tokens[1:]
        return tokens
