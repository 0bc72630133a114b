"""dataloader checks: DataLoader settings (from --config or a live DataLoader) against this host and job.

Settings come from gpudoctor.readers.dlconfig: the training config given with --config, or a DataLoader
object read by gpudoctor.audit_dataloader(). Every DataLoader argument is per rank: each
training process builds its own loader with its own worker processes.

One module per topic, discovered by gpudoctor.registry.load_all; a module whose name starts with _ holds
what the topics share and registers no check.
"""
