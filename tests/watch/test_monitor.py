"""gpudoctor.watch.Monitor in one process (no torch.distributed: no group, every window judged at once), and its
Lightning and Hugging Face faces. Neither lightning nor transformers is installed here: the callbacks are plain
classes then, and their hook methods are called as the frameworks call them, with small stand-ins for the trainer,
its state and arguments (SimpleNamespace) around a real torch model."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from gpudoctor.watch import HFCallback, LightningCallback, Monitor  # noqa: E402

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "report.schema.json").read_text())


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _train_step(model, opt, batch):
    model(batch).sum().backward()
    opt.step()
    opt.zero_grad()


def test_importing_the_package_imports_no_torch():
    code = "import sys, gpudoctor.watch; assert 'torch' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "ok\n"


def test_one_process_times_the_parts_and_writes_the_report_and_heartbeat(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    report, beat = tmp_path / "watch.json", tmp_path / "hb" / "beat.json"
    monitor = Monitor(model=model, window_s=0.01, report=str(report), heartbeat=str(beat))
    for batch in monitor.loader([torch.randn(4, 8) for _ in range(40)]):
        with monitor.step(tokens=4):
            _train_step(model, opt, batch)
    findings = monitor.close()
    assert {f.id for f in findings} == {"GD-WATCH-009", "GD-WATCH-010", "GD-WATCH-011"}
    last = monitor.windows[-1].ranks[0]
    assert last.compute_s is not None and last.compute_s > 0
    assert last.comm_s is not None and last.comm_s < last.compute_s  # not DDP: no all-reduce to wait in
    assert last.tokens_per_s and last.tokens_per_s > 0 and last.device == "cpu"
    doc = json.loads(report.read_text())
    import jsonschema

    jsonschema.validate(doc, SCHEMA)
    assert doc["watch"]["closed"] is True and doc["watch"]["steps"] == 40
    assert json.loads(beat.read_text())["step"] == 40


def test_an_error_in_the_monitor_turns_it_off_and_never_reaches_the_training_loop(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(model=model, window_s=0.01, report=str(tmp_path), heartbeat=False)  # a folder: unwritable
    err = io.StringIO()
    sys_stderr, sys.stderr = sys.stderr, err
    try:
        for batch in monitor.loader([torch.randn(4, 8) for _ in range(30)]):
            with monitor.step():
                _train_step(model, opt, batch)
        monitor.close()
    finally:
        sys.stderr = sys_stderr
    assert err.getvalue().count("monitor off after an error") == 1


def test_an_unusable_report_path_is_said_once_sanitized(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    err = io.StringIO()
    sys_stderr, sys.stderr = sys.stderr, err
    try:
        monitor = Monitor(model=model, window_s=0.01, report=str(tmp_path / "a\x00b\x1b[31m.json"), heartbeat=False)
        for batch in monitor.loader([torch.randn(4, 8) for _ in range(30)]):
            with monitor.step():
                _train_step(model, opt, batch)
        monitor.close()
    finally:
        sys.stderr = sys_stderr
    said = err.getvalue()
    assert said.count("\n") == 1 and "monitor off after an error" in said, said
    assert "\x00" not in said and "\x1b" not in said and "\\x00" in said  # the NUL written as \x00, no escape


def test_an_error_inside_backward_turns_the_monitor_off_and_backward_goes_on(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(model=model, window_s=60, heartbeat=False)
    calls = []

    def broken_mark():
        calls.append(1)
        if len(calls) > 8:
            raise RuntimeError("a broken clock")
        return 0.0

    monitor._clock.mark = broken_mark
    err = io.StringIO()
    sys_stderr, sys.stderr = sys.stderr, err
    try:
        for _ in range(5):
            with monitor.step():
                _train_step(model, opt, torch.randn(4, 8))  # the autograd callbacks raise inside backward()
    finally:
        sys.stderr = sys_stderr
    assert err.getvalue().count("monitor off after an error: RuntimeError: a broken clock") == 1
    assert monitor._broken and not monitor._handles  # hooks removed: nothing more runs in the training loop


def test_several_passes_in_a_step_add_up():
    # gradient accumulation, or several optimizer steps inside one step(): every backward is a pass of its own
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(model=model, window_s=60, heartbeat=False)
    with monitor.step():
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    passes = monitor._steps[-1].passes
    assert len(passes) == 3 and all(p[0] <= p[1] <= p[2] for p in passes)
    monitor.close()


def test_the_lightning_callback_times_the_steps_lightning_runs(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cb = LightningCallback(window_s=0.01, report=str(tmp_path / "pl.json"), tokens=len, heartbeat=False)
    trainer = SimpleNamespace(model=model)  # Lightning's trainer.model: the module as the strategy wraps it
    cb.on_train_start(trainer, model)
    monitor = cb.monitor
    for i in range(25):
        batch = torch.randn(4, 8)
        cb.on_train_batch_start(trainer, model, batch, i)
        _train_step(model, opt, batch)
        cb.on_train_batch_end(trainer, model, None, batch, i)
    cb.on_train_end(trainer, model)
    assert cb.monitor is None and monitor.windows
    assert monitor.windows[-1].ranks[0].tokens_per_s > 0  # len(batch) tokens a step
    assert json.loads((tmp_path / "pl.json").read_text())["watch"]["steps"] == 25


def test_the_hugging_face_callback_counts_the_trainers_tokens(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cb = HFCallback(window_s=0.01, report=str(tmp_path / "hf.json"), heartbeat=False)
    args, control = SimpleNamespace(), SimpleNamespace()
    state = SimpleNamespace(num_input_tokens_seen=0)
    cb.on_train_begin(args, state, control, model=model)
    monitor = cb.monitor
    for _ in range(25):
        cb.on_step_begin(args, state, control)
        _train_step(model, opt, torch.randn(4, 8))
        state.num_input_tokens_seen += 512
        cb.on_step_end(args, state, control)
    cb.on_train_end(args, state, control)
    rank = monitor.windows[-1].ranks[0]
    assert rank.tokens_per_s > 0 and rank.compute_s is not None
    assert json.loads((tmp_path / "hf.json").read_text())["summary"]["warn"] == 0
