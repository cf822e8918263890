"""Every manifest `fab k8s-job` writes validates against the schema of its kind built from the models its
project publishes on PyPI (tests/k8s_schema.py): the PyTorchJob against the training operator SDK's
(`kubeflow-training`) with the `kubernetes` client's below the pod template, the TrainJob against Kubeflow
Trainer's (`kubeflow-trainer-api`), the workdir's ConfigMap against the `kubernetes` client's, and the
ConfigMap's keys and size against the API server's rules for one. The validator itself refuses a bad
manifest (so a pass means something)."""

from __future__ import annotations

import base64
import copy
import json
import re
from importlib.metadata import version

import pytest
import yaml

from cluster.job import k8s, trainjob
from tests import k8s_schema
from tests.fab_run import ROOT, fab_in_process

IMAGE = "registry.example.com/xeon-cluster:0.1.0"
CASES = {
    "fixed": ("--nodes", "4", "--pvc", "xeon-data", "--checkpoint-every", "30m", "--checkpoint-uri", "s3://my-bucket/ckpt"),
    "elastic": ("--nodes", "4", "--min-nodes", "2", "--max-restarts", "5"),
    "intel": ("--nodes", "2", "--profile", "intel", "--env", "CCL_LOG_LEVEL=info"),
    "demo": ("--synthetic-examples", "300", "--", "--output_dir", "/out/run"),
    "script": ("--nodes", "2", "--script", "{workdir}/train.py", "--args", "--epochs 2"),
    "module": ("--module", "pkg.main", "--workdir", "{workdir}"),
}
# A TrainJob has no elastic training (--min-nodes is refused: tests/unit/test_k8s_trainjob.py).
RUNS = [(api, case) for api in k8s.APIS for case in CASES if not (api == k8s.API_TRAINJOB and case == "elastic")]
CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")  # the API server's rule for a ConfigMap's keys


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("program")
    (root / "train.py").write_text("print('training')\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "main.py").write_text("print('main')\n")
    return root


def documents(api: str, case: str, workdir) -> list[dict]:
    options = [o.replace("{workdir}", str(workdir)) for o in CASES[case]]
    result = fab_in_process("k8s-job", "--api", api, "--image", IMAGE, *options)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


@pytest.mark.parametrize("api, case", RUNS)
def test_every_generated_manifest_validates_against_its_projects_models(api, case, workdir):
    docs = documents(api, case, workdir)
    job = docs[-1]
    kind = (k8s.API_VERSION, k8s.KIND) if api == k8s.API_PYTORCHJOB else (trainjob.API_VERSION, trainjob.KIND)
    assert (job["apiVersion"], job["kind"]) == kind
    assert k8s_schema.problems(job) == []
    if case in ("script", "module"):
        (configmap,) = docs[:-1]
        assert (configmap["apiVersion"], configmap["kind"]) == ("v1", "ConfigMap")
        assert k8s_schema.problems(configmap) == []
        assert all(CONFIGMAP_KEY.match(key) for key in configmap["binaryData"])
        assert sum(len(base64.b64decode(v)) for v in configmap["binaryData"].values()) <= 1024 * 1024
    else:
        assert len(docs) == 1


@pytest.mark.parametrize("package", sorted({p for p, _ in k8s_schema.MODELS.values()} - {"kubernetes"}))
def test_the_installed_models_are_the_releases_the_docs_name(package):
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    section = docs[docs.index("## What the tests check, against what"):]
    assert f"`{package}` {version(package)}" in section, (
        f"{package} {version(package)} is installed: docs/kubernetes.md names the release the schemas come from")


def _job(api: str, workdir) -> dict:
    return documents(api, "fixed", workdir)[-1]


def _container(api: str, job: dict) -> dict:
    if api == k8s.API_PYTORCHJOB:
        return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return job["spec"]["trainer"]


@pytest.mark.parametrize("api", k8s.APIS)
def test_the_validator_refuses_an_unknown_field_a_wrong_type_and_a_missing_required_field(api, workdir):
    good = _job(api, workdir)
    assert k8s_schema.problems(good) == []
    unknown = copy.deepcopy(good)
    unknown["spec"]["nprocPerNod"] = "2"
    assert any("'nprocPerNod' was unexpected" in p for p in k8s_schema.problems(unknown))
    typo = copy.deepcopy(good)  # in a Kubernetes type too (EnvVar)
    _container(api, typo)["env"][0]["valeu"] = "1"
    assert any("'valeu' was unexpected" in p for p in k8s_schema.problems(typo))
    wrong = copy.deepcopy(good)
    _container(api, wrong)["env"][0]["value"] = 15
    assert any("15 is not of type 'string'" in p for p in k8s_schema.problems(wrong))
    missing = copy.deepcopy(good)
    del _container(api, missing)["env"][0]["name"]
    assert any("'name' is a required property" in p for p in k8s_schema.problems(missing))
    null = copy.deepcopy(good)
    null["spec"]["runPolicy" if api == k8s.API_PYTORCHJOB else "runtimeRef"] = None
    assert any("None is not of type 'object'" in p for p in k8s_schema.problems(null))


def test_a_trainjob_value_outside_an_enum_is_refused_and_a_quantity_is_a_string_or_a_number(workdir):
    job = _job(k8s.API_TRAINJOB, workdir)
    (patch,) = job["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    container["securityContext"]["seccompProfile"]["type"] = "Default"
    assert any("'Default' is not one of ['Localhost', 'RuntimeDefault', 'Unconfined']" in p
               for p in k8s_schema.problems(job))
    numbers = _job(k8s.API_TRAINJOB, workdir)
    resources = numbers["spec"]["trainer"]["resourcesPerNode"]
    resources["limits"]["cpu"] = 60
    assert k8s_schema.problems(numbers) == []
    resources["limits"]["cpu"] = [60]
    assert k8s_schema.problems(numbers)


def test_what_the_pytorchjobs_models_do_not_say_as_the_docs_say_it(workdir):
    """No enums (an outsider passes), a quantity is a string (the API server would take a number too)."""
    assert '"enum"' not in json.dumps(k8s_schema.schema(k8s.API_VERSION, k8s.KIND))
    job = _job(k8s.API_PYTORCHJOB, workdir)
    container = _container(k8s.API_PYTORCHJOB, job)
    container["securityContext"]["seccompProfile"]["type"] = "Default"
    assert k8s_schema.problems(job) == []
    container["resources"]["limits"]["cpu"] = 60
    assert any("60 is not of type 'string'" in p for p in k8s_schema.problems(job))


def test_a_check_of_the_models_the_walker_does_not_understand_stops_the_build():
    from kubernetes.client import models

    if not hasattr(models, "V1beta1PodCertificateRequestSpec"):
        pytest.skip("this kubernetes client has no model with a pattern check")
    with pytest.raises(ValueError, match="V1beta1PodCertificateRequestSpec.pkix_public_key: a check of the models "
                                         "not understood"):
        k8s_schema.openapi_schema(models, "V1beta1PodCertificateRequestSpec")
