"""cluster/job/torchrun.py: torchrun's command line and the ranks' environment from the layout."""

from __future__ import annotations

import pytest

from cluster.stack import catalog
from cluster.job.launch import CCL_TRANSPORT_ENV
from cluster.job.layout import KMP_AFFINITY, KMP_BLOCKTIME, plan_layout
from cluster.node.profiles import TCMALLOC_PATH
from cluster.job.torchrun import DEFAULT_MAX_RESTARTS, RDZV_PORT, TorchrunError, plan_torchrun, torchrun_env

R7IZ = catalog.lookup("r7iz.metal-16xl")


def option(argv, name):
    return argv[argv.index(name) + 1]


def test_fixed_nodes_give_n_nodes_the_layouts_ranks_and_a_c10d_rendezvous():
    layout = plan_layout(R7IZ, backend="gloo")
    plan = plan_torchrun(layout=layout, nodes=4, program=["-m", "training", "--epochs", "1"], rdzv_host="node0",
                         rdzv_id="job-1", torchrun="/venv/bin/torchrun")
    argv = plan.argv
    assert argv[0] == "/venv/bin/torchrun"
    assert option(argv, "--nnodes") == "4" and option(argv, "--nproc-per-node") == "2"
    assert option(argv, "--rdzv-backend") == "c10d"
    assert option(argv, "--rdzv-endpoint") == f"node0:{RDZV_PORT}" and option(argv, "--rdzv-id") == "job-1"
    assert "--max-restarts" not in argv
    assert argv[-4:] == ("-m", "training", "--epochs", "1")  # the program comes last, untouched
    assert plan.world_size == 8


def test_a_minimum_gives_an_elastic_range_and_restarts():
    layout = plan_layout(R7IZ, backend="gloo")
    plan = plan_torchrun(layout=layout, nodes=4, min_nodes=2, program=["train.py"], rdzv_host="10.0.0.1",
                         rdzv_id="j", rdzv_port=29500)
    assert option(plan.argv, "--nnodes") == "2:4" == plan.nnodes
    assert option(plan.argv, "--max-restarts") == str(DEFAULT_MAX_RESTARTS)
    assert plan.argv[-1] == "train.py"  # a user's script
    assert option(plan_torchrun(layout=layout, nodes=4, min_nodes=3, max_restarts=7, program=["t.py"],
                                rdzv_host="h", rdzv_id="j").argv, "--max-restarts") == "7"


def test_the_environment_is_the_layouts_without_what_only_mpi_can_do():
    pinned = plan_layout(R7IZ, backend="ccl")  # two ranks, pinned, CCL workers on fixed cores
    mpi_env = pinned.rank_env()
    assert "I_MPI_PIN_DOMAIN" in mpi_env and "CCL_WORKER_AFFINITY" in mpi_env and "KMP_AFFINITY" in mpi_env
    env = torchrun_env(pinned)
    assert env["OMP_NUM_THREADS"] == mpi_env["OMP_NUM_THREADS"] == "14"
    assert env["LD_PRELOAD"] == TCMALLOC_PATH
    assert env["CCL_WORKER_COUNT"] == "2"
    assert {k: env[k] for k in CCL_TRANSPORT_ENV} == CCL_TRANSPORT_ENV
    assert env["KMP_BLOCKTIME"] == KMP_BLOCKTIME
    assert not [k for k in env if k.startswith("I_MPI_")]
    assert "CCL_WORKER_AFFINITY" not in env  # core ids torchrun cannot give a rank
    assert "KMP_AFFINITY" not in env  # two ranks would pack their threads onto the same cores
    one_rank = plan_layout(R7IZ, backend="gloo", ranks_per_node=1, pin=False)
    env = torchrun_env(one_rank)
    assert env["KMP_AFFINITY"] == KMP_AFFINITY and env["OMP_NUM_THREADS"] == "32"
    assert "CCL_WORKER_COUNT" not in env and "CCL_ATL_TRANSPORT" not in env  # gloo: no oneCCL


def test_extra_environment_is_added_and_checked():
    layout = plan_layout(R7IZ, backend="gloo")
    assert torchrun_env(layout, {"FI_PROVIDER": "tcp"})["FI_PROVIDER"] == "tcp"
    with pytest.raises(TorchrunError, match="--env: '1BAD' is not a valid variable name"):
        torchrun_env(layout, {"1BAD": "x"})


@pytest.mark.parametrize("kwargs, message", [
    ({"nodes": 0}, "--nodes: 0 is not allowed"),
    ({"nodes": 2, "min_nodes": 3}, "--min-nodes: 3 is not allowed; allowed 1 to 2"),
    ({"nodes": 2, "max_restarts": 1}, "--max-restarts: 1 is only for an elastic run"),
    ({"nodes": 2, "rdzv_host": "a b"}, "rendezvous host: 'a b' is not a host name"),
    ({"nodes": 2, "rdzv_host": "$(reboot)"}, "rendezvous host: '$(reboot)'"),
    ({"nodes": 2, "rdzv_id": "a;b"}, "rendezvous id: 'a;b' is not allowed"),
    ({"nodes": 2, "rdzv_port": 80}, "rendezvous port: 80 is out of range"),
    ({"nodes": 2, "program": []}, "program: empty"),
    ({"nodes": 2, "program": ["-m"]}, "does not name a module"),
    ({"nodes": 2, "program": ["--nnodes", "3"]}, "program: '--nnodes' is not a script"),
])
def test_bad_settings_name_the_setting_and_what_is_allowed(kwargs, message):
    given = {"layout": plan_layout(R7IZ, backend="gloo"), "program": ["-m", "training"], "rdzv_host": "node0",
             "rdzv_id": "job", **kwargs}
    with pytest.raises(TorchrunError, match=message.replace("$", r"\$").replace("(", r"\(").replace(")", r"\)")):
        plan_torchrun(**given)
