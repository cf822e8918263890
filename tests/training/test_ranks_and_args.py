"""Launcher environments -> ranks, and the job's own argument checks (no torch, no processes)."""

import pytest

from training import args as job_args
from training import ranks
from training.errors import BadInput


@pytest.mark.parametrize("env, expected", [
    ({"PMI_RANK": "3", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     ranks.RankInfo(3, 8, 1, 2, "intel-mpi")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, ranks.RankInfo(1, 4, 0, 1, "open-mpi")),
    ({"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"},
     ranks.RankInfo(2, 3, 2, 3, "torchrun")),
    ({}, ranks.RankInfo(0, 1, 0, 1, "none")),
    # under mpirun the PMI variables win over a stale RANK from the user's shell
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "RANK": "5", "WORLD_SIZE": "9"}, ranks.RankInfo(0, 2, 0, 0, "intel-mpi")),
])
def test_detect_each_launcher(env, expected):
    assert ranks.detect(env) == expected


def test_torch_env_mirrors_the_launcher():
    info = ranks.detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert info.torch_env() == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


@pytest.mark.parametrize("env, message", [
    ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "PMI_RANK=2 is outside 0..1"),
    ({"PMI_RANK": "x", "PMI_SIZE": "2"}, "PMI_RANK='x' is not an integer"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE is not set"),
])
def test_detect_rejects_broken_environments(env, message):
    with pytest.raises(BadInput, match=message):
        ranks.detect(env)


def test_rendezvous_names_what_is_missing():
    info = ranks.RankInfo(0, 4, 0, 1, "intel-mpi")
    with pytest.raises(BadInput, match="MASTER_ADDR and MASTER_PORT not set for a 4-rank job"):
        ranks.rendezvous({}, info)
    with pytest.raises(BadInput, match="MASTER_PORT not set"):
        ranks.rendezvous({"MASTER_ADDR": "10.0.0.1"}, info)
    with pytest.raises(BadInput, match="MASTER_PORT='http' is not a TCP port"):
        ranks.rendezvous({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "http"}, info)
    assert ranks.rendezvous({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511"}, info) == ("10.0.0.1", 29511)
    assert ranks.rendezvous({}, ranks.RankInfo()) == ("127.0.0.1", 29500)  # one process needs none


def parsed(*argv):
    return job_args.parse_job_arguments(list(argv))


def test_defaults_follow_the_recipe():
    model, data, job = parsed()
    assert model.model_name_or_path == "distilbert-base-uncased"
    assert (data.task, data.dataset_name, data.max_seq_length, data.doc_stride) == ("qa", "squad", 384, 128)
    assert job_args.TRAINING_DEFAULTS["per_device_train_batch_size"] == 32
    assert job_args.TRAINING_DEFAULTS["num_train_epochs"] == 1.0
    _, data, _ = parsed("--task", "classification")
    assert (data.dataset_name, data.dataset_config_name, data.max_seq_length) == ("glue", "mrpc", 128)


@pytest.mark.parametrize("argv, message", [
    (["--task", "ner"], "--task: 'ner' is not allowed; choose one of qa, classification"),
    (["--dist_backend", "nccl"], "--dist_backend: 'nccl' is not allowed"),
    (["--max_seq_length", "128", "--doc_stride", "64"], "--doc_stride 64 must be below half of --max_seq_length 128"),
    (["--checkpoint_uri", "/tmp/x"], "--checkpoint_uri: '/tmp/x' is not allowed; allowed: s3://BUCKET/PREFIX"),
    (["--checkpoint_minutes", "-1"], "--checkpoint_minutes -1 is not allowed; allowed: 0"),
    (["--checkpoint_minutes", "nan"], "--checkpoint_minutes nan is not allowed; allowed: 0"),
    (["--spot_poll_seconds", "0"], "--spot_poll_seconds 0 is not allowed; allowed: a positive number of seconds"),
    (["--train_file", "/nonexistent/train.json"], "does not exist on this node"),
    (["--train_file", "data.csv"], "only .json and .jsonl files are read"),
    (["--max_train_samples", "0"], "--max_train_samples 0 must be a positive number"),
    (["--checkpoint_minutes", "soon"], "invalid float value: 'soon'"),
])
def test_bad_job_arguments_name_the_setting(argv, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(".", r"\.")):
        parsed(*argv)


class FakeTrainingArguments:
    def __init__(self, accumulation=1):
        self.gradient_accumulation_steps = accumulation
        self.per_device_train_batch_size = 8  # not the 32 the tests expect, so a no-op would fail


def test_global_batch_sets_the_per_rank_batch():
    _, _, job = parsed("--global_batch_size", "256")
    training = FakeTrainingArguments()
    job_args.apply_global_batch(job, training, world_size=8)
    assert training.per_device_train_batch_size == 32
    training = FakeTrainingArguments(accumulation=2)
    job_args.apply_global_batch(job, training, world_size=4)
    assert training.per_device_train_batch_size == 32


def test_global_batch_that_does_not_divide_suggests_neighbours():
    _, _, job = parsed("--global_batch_size", "100")
    with pytest.raises(BadInput, match=r"does not divide over 3 ranks x 1 gradient accumulation step\(s\); "
                                       r"use a multiple of 3 \(e\.g\. 99, 102\)"):
        job_args.apply_global_batch(job, FakeTrainingArguments(), world_size=3)


def test_bf16_is_explicit_only_when_given():
    assert job_args.bf16_given(["--bf16"]) and job_args.bf16_given(["--bf16=false"])
    assert not job_args.bf16_given(["--bf16_full_eval"])


def test_in_a_trainjob_whose_control_plane_takes_progress_the_trainer_reports_to_it(monkeypatch):
    """Kubeflow Trainer's TrainJobStatus gate injects KUBEFLOW_TRAINER_SERVER_URL (transformers' KubeflowCallback
    reads it); the built-in job's --report_to default follows it, so its TrainJob's status shows progress."""
    from transformers.integrations import get_reporting_integration_callbacks

    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    assert job_args.reporting() == "none"
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://trainer.kubeflow:8082/apis/x/status")
    assert job_args.reporting() == "kubeflow"
    assert [c.__name__ for c in get_reporting_integration_callbacks([job_args.reporting()])] == ["KubeflowCallback"]
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "TRUE")
    assert job_args.reporting() == "none"
