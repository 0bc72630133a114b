"""The training config as the program will run it: the --config file with the launch line's overrides applied.

One reader, used unchanged by `check` (gpudoctor.inputs.context_for) and by `fix` (fixes/plan.context_for, on
every edited copy), so the two judge the same job (issue 25, class 7).

What an argument after the program does to the config, by the rule of the parser that reads it:
- Hydra's override grammar (hydra.cc, "Override grammar / Basic Override syntax"): `key=value` changes a key
  the config has (Hydra refuses a key it lacks: "Could not override 'key'... To append to your config use
  +key=value"), `+key=value` adds a key (refused if it is there), `++key=value` adds or changes, `~key` (or
  `~key=value`) deletes it. A value is read as Hydra reads its primitives: ints, floats, bools, null, strings
  (yaml.safe_load is the same for these).
- jsonargparse (LightningCLI, "Configure hyperparameters from the CLI"): `--data.num_workers=2` or
  `--data.num_workers 2` sets the dotted key; for a `class_path`/`init_args` section the `init_args` level may
  be left out (`--model.lr` sets `model.init_args.lr`).
- `data=cifar` where the config's `data` is a section is a config-group choice (Hydra "Config groups"): the
  section comes from the group's file (`conf/data/cifar.yaml`), not the config given, so its settings are unknown.
- A plain `--num_workers 2` / `--num-workers=2` is the program's own argparse option: whether (and how) the
  program puts it into the config is in its code, not in any rule. It is recorded as a flag whose effect is
  unknown, and a setting whose key it may name becomes unknown (never judged at the config's value, never
  edited on the guess that it maps).
A value that names a shell variable the script does not set (`data.num_workers=$W`) is unknown alike.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

_HYDRA = re.compile(r"^(~|\+{0,2})([A-Za-z_][\w-]*(?:\.[\w-]+)*)(?:(=)(.*))?$", re.S)
_DOTTED_FLAG = re.compile(r"^--([A-Za-z_][\w-]*(?:\.[\w-]+)+)(?:=(.*))?$", re.S)
_PLAIN_FLAG = re.compile(r"^--?([A-Za-z_][\w-]*)(?:=(.*))?$", re.S)
_UNKNOWN = re.compile(r"[$`]")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


@dataclass(frozen=True)
class Override:
    """One launch-line argument that sets (or deletes) a config key by a known rule."""

    key: str  # the dotted key as written (jsonargparse's init_args-less form resolved in apply)
    op: str  # "set" (key=), "add" (+key=), "force" (++key=), "delete" (~key), "flag" (--a.b=v, jsonargparse)
    raw: str | None  # the value as written; None for a delete
    written: str  # the argument(s) as written, for messages

    @property
    def known(self) -> bool:
        return self.raw is None or not _UNKNOWN.search(self.raw)


@dataclass(frozen=True)
class OpaqueFlag:
    """`--num_workers 2`: an option of the program's own parser; what it sets in the config is not known."""

    name: str  # without dashes, as written ("num-workers")
    written: str

    def may_name(self, key: str) -> bool:
        """The flag spells the key's last part (`--num-workers` for `data.num_workers`)."""
        leaf = key.rsplit(".", 1)[-1]
        return _norm(self.name) == _norm(leaf)


def _norm(name: str) -> str:
    return name.replace("-", "_").lower()


@dataclass(frozen=True)
class LaunchOverrides:
    """The overrides of one launch line, in order, with the line they are on."""

    line: int | None
    overrides: tuple[Override, ...] = ()
    flags: tuple[OpaqueFlag, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.overrides or self.flags)

    def setting(self, key: str, config: dict | None = None) -> Override | None:
        """The last override that decides `key` (a dotted config path), resolved against config's shape."""
        for ov in reversed(self.overrides):
            if _target(ov, config) == key:
                return ov
        return None

    def group_choice(self, key: str, config: dict | None) -> Override | None:
        """A Hydra config-group choice (`data=cifar` where the config's `data` is a section) that key lies under:
        the section then comes from the group's own file, which is not the config given."""
        for ov in reversed(self.overrides):
            if ov.op in ("set", "force") and key.startswith(ov.key + ".") and _is_section(config, ov.key):
                return ov
        return None

    def opaque(self, key: str) -> OpaqueFlag | None:
        """A plain flag of the program that may set `key`: the value the job runs with is then not known."""
        return next((f for f in self.flags if f.may_name(key)), None)

    def where(self) -> str:
        return f"launch line {self.line}" if self.line else "the launch line"

    def apply(self, config: dict | None) -> dict | None:
        """The config the program runs with (a copy; the input is not changed). Overrides whose value is unknown
        remove the key's value (None), so nothing judges the file's value the line replaces."""
        if config is None:
            return None
        out = copy.deepcopy(config)
        for ov in self.overrides:
            _apply_one(out, ov, config)
        return out


def _is_section(config: dict | None, key: str) -> bool:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return isinstance(node, dict)


def _target(ov: Override, config: dict | None) -> str:
    """jsonargparse's `--model.lr` means `model.init_args.lr` when model is a class_path/init_args section."""
    if ov.op != "flag" or not isinstance(config, dict):
        return ov.key
    parts = ov.key.split(".")
    node: Any = config
    out: list[str] = []
    for part in parts:
        if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
            out.append("init_args")
        out.append(part)
        node = node.get(part) if isinstance(node, dict) else None
    return ".".join(out)


def _value(raw: str) -> Any:
    import yaml

    if not raw:
        return ""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str) and _FLOAT.fullmatch(raw):
        return float(raw)  # Hydra reads 1e-3 as a float; YAML 1.1 (PyYAML) wants a dot
    return value


def _apply_one(out: dict, ov: Override, original: dict) -> None:
    parts = _target(ov, original).split(".")
    node: Any = out
    for part in parts[:-1]:
        if not isinstance(node, dict):
            return
        if part not in node:
            if ov.op not in ("add", "force"):
                return  # Hydra refuses it (the program stops at start-up); the config is unchanged
            node[part] = {}
        node = node[part]
    if not isinstance(node, dict):
        return
    leaf = parts[-1]
    if ov.op in ("set", "force") and isinstance(node.get(leaf), dict) and not isinstance(_value(ov.raw or ""), dict):
        return  # Hydra: `group=option` picks the section's file (LaunchOverrides.group_choice); the section stays
    if ov.op == "delete":
        node.pop(leaf, None)
    elif ov.op == "add" and leaf in node:
        return  # Hydra refuses it: "Could not append to config. An item is already at ..."
    elif ov.op == "set" and leaf not in node:
        return
    else:
        node[leaf] = _value(ov.raw or "") if ov.known else None


def read_overrides(args: tuple[str, ...] | list[str], line: int | None = None) -> LaunchOverrides:
    """The overrides among a program's arguments (the words after the program on the launch line)."""
    overrides: list[Override] = []
    flags: list[OpaqueFlag] = []
    i = 0
    while i < len(args):
        word = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None
        takes_next = nxt is not None and not nxt.startswith("-")
        if m := _DOTTED_FLAG.match(word):
            value = m.group(2)
            if value is None and takes_next:
                value, i = nxt, i + 1
            if value is not None:
                overrides.append(Override(m.group(1), "flag", value, f"{word} {nxt}" if m.group(2) is None else word))
        elif m := _PLAIN_FLAG.match(word):
            # `--fast data.x=1`: whether --fast takes a value is the program's business; a word with `=` after a
            # flag is read as the override it looks like, anything else as the flag's value.
            value_next = m.group(2) is None and takes_next and "=" not in (nxt or "")
            flags.append(OpaqueFlag(m.group(1), f"{word} {nxt}" if value_next else word))
            i += value_next
        elif m := _HYDRA.match(word):
            prefix, key, eq, raw = m.groups()
            if prefix == "~":
                overrides.append(Override(key, "delete", None, word))
            elif eq:
                op = {"": "set", "+": "add", "++": "force"}[prefix]
                overrides.append(Override(key, op, raw, word))
        i += 1
    return LaunchOverrides(line, tuple(overrides), tuple(flags))


def launch_overrides(sbatch) -> LaunchOverrides | None:
    """The overrides on a batch script's training launch line; None without one."""
    launch = getattr(sbatch, "launch", None)
    if launch is None:
        return None
    return read_overrides(tuple(launch.script_args), launch.line)


def job_config(config: dict | None, sbatch) -> tuple[dict | None, LaunchOverrides | None]:
    """(the config the program runs with, the overrides that made it): the one reading of --config and the
    launch line that check and fix both use."""
    overrides = launch_overrides(sbatch)
    if config is None or not overrides:
        return config, overrides
    return overrides.apply(config), overrides
