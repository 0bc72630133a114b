"""The smoke run: a small bf16 GPT trained under DDP (installed as gpudoctor.sample_train). The torch side
(launch, worker, bench, parts, model, data, selftest) lives here; the pure judgement in judge/."""
