"""Every manifest `fab k8s-job` writes validates against the CRD schema its project published for its kind
(tests/k8s_schema.py, tests/k8s_crds/): the PyTorchJob against the training operator v1.9.4's, the
TrainJob against Kubeflow Trainer v2.3.0's; the workdir's ConfigMap against the API server's rules for
one. The validator itself refuses what the API server refuses (so a pass means something)."""

from __future__ import annotations

import base64
import copy
import re
from importlib.metadata import version

import pytest
import yaml

from cluster.job import k8s, trainjob
from tests import k8s_schema
from tests.fab_run import fab_in_process

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
def test_every_generated_manifest_validates_against_its_published_schema(api, case, workdir):
    docs = documents(api, case, workdir)
    job = docs[-1]
    kind = (k8s.API_VERSION, k8s.KIND) if api == k8s.API_PYTORCHJOB else (trainjob.API_VERSION, trainjob.KIND)
    assert (job["apiVersion"], job["kind"]) == kind
    assert k8s_schema.problems(job) == []
    if case in ("script", "module"):
        (configmap,) = docs[:-1]
        assert (configmap["apiVersion"], configmap["kind"]) == ("v1", "ConfigMap")
        assert all(CONFIGMAP_KEY.match(key) for key in configmap["binaryData"])
        assert sum(len(base64.b64decode(v)) for v in configmap["binaryData"].values()) <= 1024 * 1024
    else:
        assert len(docs) == 1


@pytest.mark.parametrize("name, schema", [("pytorchjob.json", "kubeflow-training"),
                                          ("trainjob.json", "kubeflow-trainer-api")])
def test_the_schemas_are_of_the_release_whose_models_build_the_manifests(name, schema):
    source = k8s_schema.load(name)["source"]
    assert source["release"] == f"v{version(schema)}", (
        f"tests/k8s_crds/{name} is of {source['release']}, {schema} is {version(schema)}: refresh the schema "
        "(python -m tests.k8s_schema) or move the pin back")
    assert re.fullmatch(r"[0-9a-f]{64}", source["sha256"]) and source["file"].endswith(".yaml")


def _job(api: str, workdir) -> dict:
    return documents(api, "fixed", workdir)[-1]


def _container(api: str, job: dict) -> dict:
    if api == k8s.API_PYTORCHJOB:
        return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return job["spec"]["trainer"]


@pytest.mark.parametrize("api", k8s.APIS)
def test_the_validator_refuses_an_unknown_field_a_wrong_type_and_a_repeated_list_key(api, workdir):
    good = _job(api, workdir)
    unknown = copy.deepcopy(good)
    unknown["spec"]["nprocPerNod"] = "2"
    assert any("'nprocPerNod' was unexpected" in p for p in k8s_schema.problems(unknown))
    wrong = copy.deepcopy(good)
    _container(api, wrong)["env"][0]["value"] = 15
    assert any("15 is not of type 'string'" in p for p in k8s_schema.problems(wrong))
    repeated = copy.deepcopy(good)
    _container(api, repeated)["env"].append(dict(_container(api, repeated)["env"][0]))
    assert any("map list repeats" in p and "OMP_NUM_THREADS" in p for p in k8s_schema.problems(repeated))
    numbers = copy.deepcopy(good)  # a quantity is an integer or a string (x-kubernetes-int-or-string)
    resources = (numbers["spec"]["trainer"]["resourcesPerNode"] if api == k8s.API_TRAINJOB
                 else _container(api, numbers)["resources"])
    resources["limits"]["cpu"] = 60
    assert k8s_schema.problems(numbers) == []
    resources["limits"]["cpu"] = [60]
    assert k8s_schema.problems(numbers)


def test_the_trainjobs_cel_rules_are_evaluated_and_an_unknown_rule_is_not_skipped(workdir):
    job = _job(k8s.API_TRAINJOB, workdir)
    for name in ("Upper", "a" * 64):
        bad = copy.deepcopy(job)
        bad["metadata"]["name"] = name
        assert k8s_schema.problems(bad), name
    managed = copy.deepcopy(job)
    managed["spec"]["managedBy"] = "someone/else"
    assert any("ManagedBy must be" in p for p in k8s_schema.problems(managed))
    assert k8s_schema.cel_holds("self == oldSelf", 1) is None  # an update's rule: not for a create
    with pytest.raises(ValueError, match="not understood"):
        k8s_schema.cel_holds("self.all(x, x > 0)", [1])
