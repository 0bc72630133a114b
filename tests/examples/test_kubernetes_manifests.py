"""The Kubernetes examples (examples/kubernetes/) are valid manifests and run real gpudoctor commands.

kubernetes-validate checks each document offline against the OpenAPI schemas it ships, strictly (an
unknown or misspelt field fails), for the oldest Kubernetes these examples claim and for the newest the
package knows. The gpudoctor command lines in them are parsed by gpudoctor's own parser, so an option
renamed in the CLI fails here rather than in a user's cluster."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpudoctor.cli import build_parser

EXAMPLES = Path(__file__).parents[2] / "examples" / "kubernetes"
# The oldest release the examples claim (Job podFailurePolicy: beta and on by default since 1.26, GA in 1.31).
OLDEST = "1.30.0"
VERSIONS = (OLDEST, kubernetes_validate.latest_version())


def documents() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def by_name(name: str) -> dict:
    return next(doc for file, doc in documents() if file == name)


def test_there_are_examples():
    assert {f for f, _ in documents()} == {"train-job-gated.yaml", "smoke-job.yaml"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name, doc", documents(), ids=lambda v: v if isinstance(v, str) else "")
def test_manifest_validates_strictly(name, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError on a bad manifest


def test_a_misspelt_field_is_caught():
    """The validation can fail: initContainer (singular) is no field of a PodSpec."""
    doc = copy.deepcopy(by_name("train-job-gated.yaml"))
    spec = doc["spec"]["template"]["spec"]
    spec["initContainer"] = spec.pop("initContainers")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, OLDEST, strict=True)


def gpudoctor_args(container: dict) -> list[str]:
    command = container["command"] + container.get("args", [])
    assert command[:3] == ["python", "-m", "gpudoctor"], command
    return command[3:]


def test_init_container_gates_training_on_check_with_the_same_gpus():
    pod = by_name("train-job-gated.yaml")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (train,) = pod["containers"]
    args = build_parser().parse_args(gpudoctor_args(init))
    assert args.command == "check"
    gpus = train["resources"]["limits"]["nvidia.com/gpu"]
    assert args.expect_gpus == gpus == init["resources"]["limits"]["nvidia.com/gpu"]
    assert init["image"] == train["image"]  # the check judges the torch the training uses
    shm = {m["mountPath"]: m["name"] for c in (init, train) for m in c["volumeMounts"]}
    assert shm == {"/dev/shm": "dshm"}
    assert pod["restartPolicy"] == "Never"  # required by the Job's podFailurePolicy


def test_smoke_job_runs_smoke_within_its_deadline():
    job = by_name("smoke-job.yaml")["spec"]
    (smoke,) = job["template"]["spec"]["containers"]
    args = build_parser().parse_args(gpudoctor_args(smoke))
    assert args.command == "smoke" and args.json
    assert smoke["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert args.timeout < job["activeDeadlineSeconds"]
