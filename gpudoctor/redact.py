"""The one redaction rule: what of a user's file, argv or environment gpudoctor may print.

gpudoctor quotes other people's scripts, configs and environments (evidence, the fix plan and its diff
context, annotations, JUnit, Prometheus labels, snapshots). Every such quote passes through `redact`
(a line) or `redact_text` (many lines); the readers use the same rule for the facts they keep, so a check
never holds a secret it could print. The file `fix --apply` writes keeps the user's bytes: redaction is for
what is shown, never for what is written back.

A value is blanked (`<redacted>`) when
- its name says credential (`is_credential_name`: KEY, TOKEN, SECRET, PASSWORD, AUTH, ... in the name), in
  any of the forms that name a value: NAME=value, NAME+=value, export/env/declare NAME=value, --option value,
  --option=value, and `name: value` / `"name": "value"` (YAML, JSON, INI);
- it is the user:password@ part of a URL or of a bare host (`https://u:pw@mirror`, `MASTER_ADDR=u:pw@n1`),
  or a credential query parameter (`?token=`, `&X-Amz-Signature=`);
- it has the shape of a well-known token whatever its name: Hugging Face `hf_...`, OpenAI/Anthropic `sk-...`,
  AWS access key ids `AKIA...`/`ASIA...`, GitHub `ghp_...`/`github_pat_...`, GitLab `glpat-...`, Slack
  `xox?-...`, Google API keys `AIza...`, Stripe `sk_live_...`, and private-key PEM headers (the prefixes
  GitHub's secret scanning documents: docs.github.com, "Supported secret scanning patterns").
A value that only names a variable (`$WANDB_API_KEY`) shows no secret and stays as written.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

# ---------------------------------------------------------------- credential names

# A credential word anywhere in the name, or PASS/PWD/PW as a whole part of it (DB_PASS, SMTP_PWD, PW_FILE;
# BYPASS or PASSES name no password). Bounded by lookarounds, not ^/$: readers/sbatch searches whole script
# text with this pattern (upper-cased, so it must stay upper case).
_CREDENTIAL = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|PASSWD|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION|SIGNATURE"
    r"|(?<![A-Z0-9])(?:PASS|PWD|PW|PSWD)(?![A-Z0-9])",
    re.I,
)
# The same, matched against upper-cased text (a case-insensitive search is far slower on 3 MB).
_CREDENTIAL_WORD = re.compile(_CREDENTIAL.pattern)

# Settings whose names merely contain a credential word (an InfiniBand partition key is no secret).
_NOT_CREDENTIALS = frozenset({"NCCL_IB_PKEY", "PWD"})  # PWD: the shell's working directory


def is_credential_name(name: str) -> bool:
    return name not in _NOT_CREDENTIALS and bool(_CREDENTIAL.search(name))


def _credential_option(option: str) -> bool:
    """--hf-token, --wandb.api_key, -password: the option's name read as a variable name."""
    return is_credential_name(option.lstrip("-").replace("-", "_").replace(".", "_"))


# ---------------------------------------------------------------- user:password@ and query parameters

# Credentials inside a value: HF_ENDPOINT=https://user:token@mirror, MASTER_ADDR=alice:pw@10.0.0.1,
# https://host/x?token=... . Scanned word by word with str methods, never with a backtracking regex over the
# whole value (a pasted 120k-character value must cost linear time).
# With a ':' a URL's password may itself hold '/' or '@' (RFC 3986 wants them escaped; people paste them raw),
# so everything up to the URL's last '@' goes; a bare token@ stops at the first '/'.
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
# A query parameter whose name is credential-like (?token=, &access_token=, &sig=, X-Amz-Signature=).
_QUERY_SECRET = re.compile(r"([?&;])([^=&;#\s]+)=([^&;#\s]*)")
_QUERY_SECRET_NAMES = frozenset({"sig", "signature", "code", "pw", "pwd", "pass", "apikey", "api_key", "key"})


def redact_value(value: str) -> str:
    """A value (an environment variable's, an option's) with the credentials inside it blanked; its name is
    the caller's to judge (is_credential_name). The whole rule of `redact` applies."""
    return redact(value)


def _redact_userinfo_words(text: str) -> str:
    return "".join(_redact_word(w) if "@" in w else w for w in re.split(r"(\s+)", text))


def _redact_word(word: str) -> str:
    if "://" not in word:
        # user:password@host without a scheme, in a list item or after NAME=
        return "".join(_redact_userinfo(piece, bare=True) for piece in re.split(r"([,;=])", word))
    out, start = [], 0
    marks = []
    pos = word.find("://")
    while pos >= 0:
        marks.append(pos)
        pos = word.find("://", pos + 3)
    for n, mark in enumerate(marks):
        end = len(word)
        if n + 1 < len(marks):  # this URL ends where the next one's scheme begins
            end = marks[n + 1]
            while end > mark + 3 and word[end - 1] in _SCHEME_CHARS:
                end -= 1
        out.append(word[start : mark + 3])
        out.append(_redact_userinfo(word[mark + 3 : end], bare=False))
        start = end
    out.append(word[start:])
    return "".join(out)


def _redact_userinfo(rest: str, bare: bool) -> str:
    """rest (what follows scheme://, or a bare word) with a leading user:password@ or token@ blanked."""
    last_at = rest.rfind("@")
    if last_at < 0:
        return rest
    colon, slash = rest.find(":"), rest.find("/")
    if 0 < colon < last_at and (slash < 0 or colon < slash):
        lead = len(rest) - len(rest.lstrip("\"'"))  # a quote that opens the value stays
        return rest[:lead] + REDACTED + rest[last_at:]
    first_at = rest.find("@")
    if not bare and first_at > 0 and (slash < 0 or first_at < slash):
        return REDACTED + rest[first_at:]
    return rest


def _redact_query(m: re.Match) -> str:
    name = m.group(2)
    plain = name.lower().replace("-", "_")
    if (
        is_credential_name(name.replace("-", "_"))
        or plain in _QUERY_SECRET_NAMES
        or plain.startswith(("x_amz_", "x_goog_"))
    ):
        return f"{m.group(1)}{name}={REDACTED}"
    return m.group(0)


# Up to the last @ before a blank or quote: a password may hold '/' or '@' (over-redacting a path with an @ is safe).
_URL_AUTHORITY_END = re.compile(r"[\s\"']")


def redact_url_userinfo(text: str) -> str:
    """scheme://user:token@host -> scheme://<redacted>@host, in one linear pass over text with blanks."""
    out, at = [], 0
    while (sep := text.find("://", at)) >= 0:
        start = sep + 3
        stop = _URL_AUTHORITY_END.search(text, start)
        end = stop.start() if stop else len(text)
        userinfo_end = text.rfind("@", start, end)
        out.append(text[at:start])
        if userinfo_end > start:
            out.append(REDACTED)
            at = userinfo_end
        else:
            at = start
    out.append(text[at:])
    return "".join(out)


# ---------------------------------------------------------------- named values in text

# A value that only names a variable ($WANDB_API_KEY) shows no secret: it stays as written.
_REFERENCE = re.compile(r"""(["']?)\$\{?[A-Za-z_][A-Za-z0-9_]*\}?\1""")
# A value as a shell or a config writes it: "double" (with \" inside), 'single', $'ANSI-C', or a bare word.
_VALUE = r"""("(?:[^"\\]|\\.)*"|'[^']*'|\$'(?:[^'\\]|\\.)*'|[^\s;&|]*)"""
# NAME=value, NAME+=value (after export, env, declare -x, a comma of --export=, ...)
_CRED_ASSIGN = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)(\+?=)" + _VALUE)
# --option value / --option=value / -option value
_CRED_OPTION = re.compile(
    r"""(?<![\w])(--?[A-Za-z][\w.-]*)(=|[ \t]+)("(?:[^"\\]|\\.)*"|'[^']*'|\$'(?:[^'\\]|\\.)*'|[^\s;&|-][^\s;&|]*)"""
)
# name: value, "name": "value", name = value (YAML, JSON, INI, TOML, Python); the value ends at a blank, a
# comma or a closing bracket unless it is quoted.
_CRED_KEY = re.compile(
    r"""(?<![\w-])(["']?)([A-Za-z_][\w.-]*)\1(\]?[ \t]*(?::|=)[ \t]*)("(?:[^"\\]|\\.)*"|'[^']*'|[^\s,#}\]]+)"""
)
# A quoted string named by a credential word wherever it sits, nested in a call or a literal as program source
# writes it: `W(api_key='...')`, `{'token': "..."}` (the value patterns above end at a blank, not at a bracket).
_CRED_STRING = re.compile(r"""(['"]?)([A-Za-z_][\w.-]*)\1[ \t]*[=:][ \t]*('(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""")
# An HTTP Authorization header's credentials (RFC 7235: `Authorization: <scheme> <credentials>`; Bearer is
# RFC 6750), curl/wget's user:password (`-u alice:pw`, `-ualice:pw`, `--user=alice:pw`, `--proxy-user`, `-U`),
# and netrc's `password WORD` (netrc(5)).
_AUTH_SCHEME = re.compile(r"(?i)(?<![\w-])(Bearer|Basic|Digest|Token)([ \t]+)([A-Za-z0-9._~+/=:-]{6,})")
# curl's -u/-U take the value attached too (`-ubob:pw`, as getopt reads a short option).
_USER_OPTION = re.compile(
    r"(?<![\w-])(-[uU]|--user|--proxy-user|--http-user)(=|[ \t]+|(?<=-[uU])(?=[^\s=-]))([\"']?)([^\s:\"']*):([^\s\"']+)"
)
_NETRC_PASSWORD = re.compile(r"(?<![\w-])(password|passwd)([ \t]+)(?!<redacted>)(\S+)")

# Well-known token shapes (GitHub secret scanning's documented prefixes), whatever name holds them.
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"hf_(?=[A-Za-z0-9]*[A-Z0-9])[A-Za-z0-9]{8,}"  # Hugging Face user access token
    r"|sk-(?:ant-|proj-)?[A-Za-z0-9_-]{12,}"  # OpenAI, Anthropic
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}"  # Stripe
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{12,}"  # AWS access key ids
    r"|gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{16,}"  # GitLab
    r"|xox[abposr]-[A-Za-z0-9-]{8,}"  # Slack
    r"|AIza[A-Za-z0-9_-]{20,}"  # Google API key
    r"|npm_[A-Za-z0-9]{20,}|pypi-[A-Za-z0-9_-]{16,}"  # package registries
    r")"
)
_TOKEN_PREFIXES = ("hf_", "sk-", "sk_", "rk_", "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "gh", "glpat-", "xox", "AIza")
_TOKEN_PREFIXES_MORE = ("npm_", "pypi-")
_PRIVATE_KEY = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|$)", re.S)


def _has_token_prefix(text: str) -> bool:
    return any(p in text for p in _TOKEN_PREFIXES) or any(p in text for p in _TOKEN_PREFIXES_MORE)


def redact(text: str) -> str:
    """text (a line, a value, a word) as gpudoctor may print it: the module's rule applied."""
    if "://" in text:
        text = redact_url_userinfo(text)
    if "@" in text:
        text = _redact_userinfo_words(text)
    if "=" in text and ("?" in text or "&" in text):
        text = _QUERY_SECRET.sub(_redact_query, text)
    if _has_token_prefix(text):
        text = _TOKEN.sub(REDACTED, text)
    if "PRIVATE KEY-----" in text:
        text = _PRIVATE_KEY.sub(f"-----BEGIN \\1PRIVATE KEY----- {REDACTED}", text)
    blank = " " in text or "\t" in text
    if ":" in text and "-" in text:
        text = _USER_OPTION.sub(rf"\1\2\3\4:{REDACTED}", text)
    if blank:
        text = _AUTH_SCHEME.sub(rf"\1\2{REDACTED}", text)
    # A named secret needs a separator after its name (=, :, a blank); a value of one word (a 64 KiB
    # variable, as `x=$x$x` builds) skips the search over its upper-cased copy.
    if not (blank or "=" in text or ":" in text) or not _CREDENTIAL_WORD.search(text.upper()):
        return text

    def assign(m: re.Match) -> str:
        value = m.group(3)
        secret = is_credential_name(m.group(1)) and value and not value.startswith(REDACTED)
        secret = secret and not _REFERENCE.fullmatch(value)
        return f"{m.group(1)}{m.group(2)}{REDACTED}" if secret else m.group(0)

    def option(m: re.Match) -> str:
        value = m.group(3)
        secret = _credential_option(m.group(1)) and not value.startswith(REDACTED) and not _REFERENCE.fullmatch(value)
        return f"{m.group(1)}{m.group(2)}{REDACTED}" if secret else m.group(0)

    def string(m: re.Match) -> str:
        name, value = m.group(2), m.group(3)
        if not _credential_option(name) or _REFERENCE.fullmatch(value):
            return m.group(0)
        return m.group(0)[: m.start(3) - m.start(0)] + REDACTED

    def key(m: re.Match) -> str:
        quote, name, sep, value = m.groups()
        if value.startswith(REDACTED) or _REFERENCE.fullmatch(value) or not _credential_option(name):
            return m.group(0)
        return f"{quote}{name}{quote}{sep}{REDACTED}"

    text = _CRED_OPTION.sub(option, _CRED_ASSIGN.sub(assign, text))
    if ":" in text or "=" in text:
        text = _CRED_KEY.sub(key, text)
        if "'" in text or '"' in text:
            text = _CRED_STRING.sub(string, text)
    return _NETRC_PASSWORD.sub(rf"\1\2{REDACTED}", text)


def redact_text(text: str) -> str:
    """Many lines (a diff, a file's excerpt), each redacted; a private key's PEM block as a whole."""
    if "PRIVATE KEY-----" in text:
        text = _PRIVATE_KEY.sub(f"-----BEGIN \\1PRIVATE KEY----- {REDACTED}", text)
    return "\n".join(redact(line) for line in text.split("\n"))


def redact_strings(value):
    """A JSON-like value with every string in it (keys too) redacted."""
    if isinstance(value, str):
        return redact_text(value) if "\n" in value else redact(value)
    if isinstance(value, dict):
        return {redact_strings(k): redact_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_strings(v) for v in value]
    return value


_OPTION_WORD = re.compile(r"(--?[A-Za-z][\w.-]*)(=.*)?$", re.S)
_ASSIGN_WORD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)


def redact_words(words: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Words after quote removal (an argv, a command's words): what `redact` would blank in them written as
    one line. Each word is judged alone (the values of credential-named options and NAME=value become
    <redacted>, and the word gets `redact`), and with the word before it, as the line `PREV WORD` reads:
    an option and its value in two words (`-u bob:pw`, `--proxy-user u:pw`, `Bearer TOKEN`, `password X`)
    is the same secret as in one (`--user=bob:pw`). A value the pair rule blanks that holds a blank itself
    (`-u 'bob:pa ss'`) is blanked whole: the line rule stops at a blank."""
    out: list[str] = []
    hide_next = False
    prev: str | None = None
    for word in words:
        if hide_next:
            shown = word if _REFERENCE.fullmatch(word) else REDACTED
            hide_next = False
        else:
            shown, hide_next, plain = _word_alone(word)
            if plain and prev is not None and _may_span(prev, word):
                shown = _word_after(prev, word, shown)
        out.append(shown)
        prev = word
    return tuple(out)


# The words a rule of `redact` reads across a blank begin its match: an option (`-u`, `--user`, `--token`), an
# HTTP auth scheme (`Bearer`), netrc's `password`, or a `name:`/`name =` whose separator ends the word before
# or begins the next one. Only such a pair can show the line rule something neither word shows alone.
_SPANNING_WORDS = frozenset({"bearer", "basic", "digest", "token", "password", "passwd"})


def _may_span(prev: str, word: str) -> bool:
    return prev[:1] == "-" or prev[-1:] in (":", "=", "]") or word[:1] in (":", "=") or prev.lower() in _SPANNING_WORDS


def _word_alone(word: str) -> tuple[str, bool, bool]:
    """(word as shown, whether the next word is a credential option's value, whether `redact` alone judged it)."""
    option = _OPTION_WORD.match(word)
    assign = _ASSIGN_WORD.match(word)
    if _REFERENCE.fullmatch(word.split("=", 1)[-1]):
        return word, False, False
    if option and _credential_option(option.group(1)):
        return (f"{option.group(1)}={REDACTED}", False, False) if option.group(2) else (word, True, False)
    if assign and is_credential_name(assign.group(1)):
        return f"{assign.group(1)}{assign.group(2)}={REDACTED}", False, False
    return redact(word), False, True


def _word_after(prev: str, word: str, shown: str) -> str:
    """word as the line `prev word` shows it, where that blanks more than word alone does (shown)."""
    if not prev or any(c.isspace() for c in prev) or not word:
        return shown
    head = redact(prev) + " "
    line = redact(f"{prev} {word}")
    if line == head + shown:
        return shown
    if not line.startswith(head) or any(c.isspace() for c in word):
        return REDACTED
    return line[len(head) :]


def redact_cmdline(cmdline: str) -> str:
    """The kernel command line with the values of credential-like parameters blanked (an iSCSI or
    network-boot password can sit there: key=value words, keys judged like environment names)."""
    words = []
    for word in cmdline.split(" "):
        key, eq, _ = word.partition("=")
        secret = eq and is_credential_name(key.replace(".", "_").replace("-", "_"))
        words.append(f"{key}={REDACTED}" if secret else redact(word))
    return " ".join(words)
