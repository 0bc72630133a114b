"""`gpudoctor diagnose`'s signature table, by topic (ranks, rendezvous, network, library, resources, framework,
slurm, hardware, followers): each module holds rows of `_signature.Signature` and declares them as verdicts,
so adding a signature is adding a row, with a real log beside it in tests/fixtures/logs/."""
