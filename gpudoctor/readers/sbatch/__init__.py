"""Reading a SLURM batch script without running it (`gpudoctor check --sbatch job.slurm`).

    sb = load_sbatch("train.slurm")          -> BatchScript (script.py), values with their spans
    sb.options        {"gres": "gpu:h200:1", "ntasks-per-node": "8", ...}  (canonical long names)
    sb.directives     Directive(option, value, written, line, text, span, value_span, line_span), ...
    sb.launch         the training Launch: srun options, launcher, its process counts, text as written
    sb.exports        {"CUDA_VISIBLE_DEVICES": Assignment(name, value, line, text, span, value_span, ...)}
    sb.broken_continuations, sb.late_directives, sb.bash_syntax   what bash/sbatch will do differently

Modules: options (sbatch/srun option tables, getopt reading), shell (bash lexer with spans,
bounded expansion, if/fi branches), header (the #SBATCH lines as sbatch reads them), body (the
commands as the batch shell runs them), continuations (broken line continuations), launch (launchers
and wrappers), script (the typed result), reader (parse_sbatch/load_sbatch).
"""

from gpudoctor.readers.sbatch.body import PER_TASK_VARS, expand_vars
from gpudoctor.readers.sbatch.header import gpus_per_node_requested, implied_slurm_env
from gpudoctor.readers.sbatch.launch import LAUNCHERS, describe_command
from gpudoctor.readers.sbatch.options import (
    ALIASES,
    FLAG_OPTIONS,
    INTEGER_OPTIONS,
    SHORT,
    SHORT_FLAGS,
    VALUE_OPTIONS,
    canonical,
    close_option,
    parse_options,
    read_options,
)
from gpudoctor.readers.sbatch.reader import MAX_SCRIPT_BYTES, editing, load_sbatch, parse_sbatch, reparse_sbatch
from gpudoctor.readers.sbatch.script import (
    Assignment,
    BashSyntax,
    BatchScript,
    BrokenContinuation,
    Directive,
    Launch,
    SbatchError,
    ScriptLine,
    Span,
    SrunStep,
)
from gpudoctor.redact import REDACTED, redact

__all__ = [
    "ALIASES",
    "FLAG_OPTIONS",
    "INTEGER_OPTIONS",
    "LAUNCHERS",
    "MAX_SCRIPT_BYTES",
    "PER_TASK_VARS",
    "REDACTED",
    "SHORT",
    "SHORT_FLAGS",
    "VALUE_OPTIONS",
    "Assignment",
    "BashSyntax",
    "BatchScript",
    "BrokenContinuation",
    "Directive",
    "Launch",
    "SbatchError",
    "ScriptLine",
    "Span",
    "SrunStep",
    "canonical",
    "close_option",
    "describe_command",
    "expand_vars",
    "gpus_per_node_requested",
    "implied_slurm_env",
    "editing",
    "load_sbatch",
    "parse_options",
    "parse_sbatch",
    "reparse_sbatch",
    "read_options",
    "redact",
]
