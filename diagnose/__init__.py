"""`gpudoctor diagnose LOG...`: read a failed job's log and name the first cause, the rank and the fix
(docs/diagnose.md). The reader (logread) streams the log in bounded memory, the signatures are the rows of
gpudoctor.checks.diagnose (signatures collects them), the judge (judge) is pure, the command is cli."""
