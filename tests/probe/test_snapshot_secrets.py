"""`gpudoctor snapshot` with real environment variables: settings are kept, secrets are not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpudoctor.facts import collectable_env
from tests.cliutil import clean_env

ROOT = Path(__file__).resolve().parents[2]


def test_snapshot_keeps_settings_and_drops_credentials(tmp_path):
    env = {
        **clean_env(drop=("HF_",)),
        "NCCL_IB_PKEY": "0x8001",  # an InfiniBand partition key: a setting
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps",
        "HF_TOKEN": "hf_secret_1",
        "WANDB_API_KEY": "secret_2",
        "AWS_SECRET_ACCESS_KEY": "secret_3",
        "MY_PASSWORD": "secret_4",
        "HF_ENDPOINT": "https://alice:secret_5@hf-mirror.internal",  # a credential inside a setting
    }
    out = tmp_path / "node.json"
    r = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "snapshot", "-o", str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "secret" not in text
    got = json.loads(text)["env"]["vars"]
    assert got["NCCL_IB_PKEY"] == "0x8001" and got["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/mps"
    assert got["HF_ENDPOINT"] == "https://<redacted>@hf-mirror.internal"


def test_token_as_url_user_is_redacted_too():
    got = collectable_env({"HF_ENDPOINT": "https://hf_abc123@mirror/x", "MASTER_ADDR": "10.0.0.1"})
    assert got == {"HF_ENDPOINT": "https://<redacted>@mirror/x", "MASTER_ADDR": "10.0.0.1"}
