"""Every check of a whole value refuses a trailing newline.

A pattern ending in `$` also matches just before a final "\\n", so `ubuntu\\n` or `10.0.0.1\\n` would
pass a check and then break the line of the file or script it is written into. The checks below
guard values that reach file names, shell commands, rendezvous options and cluster config.
"""

from __future__ import annotations

import pytest

from cluster.calibration import cluster_file_name
from cluster.jobplan import check_job_id
from cluster.layout import plan_layout
from cluster.catalog import CATALOG
from cluster.torchrun import check_program, plan_torchrun
from cluster.userjob import check_module
from node_setup.local.state import LocalClusterError, validate_name
from tests.unit.test_spec import problems, spec
from training.checkpoints import step_of


def _torchrun(**given):
    values = dict(rdzv_host="10.0.0.2", rdzv_id="job1")
    values.update(given)
    layout = plan_layout(CATALOG["c6i.16xlarge"], backend="gloo")
    return plan_torchrun(layout=layout, nodes=2, program=["-m", "training"], **values)


CHECKS = {
    "calibration cluster name": lambda v: cluster_file_name(v),
    "job id": lambda v: check_job_id(v),
    "module name": lambda v: check_module(v),
    "program module": lambda v: check_program(["-m", v]),
    "local cluster name": lambda v: validate_name(v),
    "rendezvous host": lambda v: _torchrun(rdzv_host=v),
    "rendezvous id": lambda v: _torchrun(rdzv_id=v),
}
GOOD = {
    "calibration cluster name": "local",
    "job id": "20261123-101500-ab12",
    "module name": "my_pkg.train",
    "program module": "training",
    "local cluster name": "demo",
    "rendezvous host": "10.0.0.2",
    "rendezvous id": "job1",
}


@pytest.mark.parametrize("what", sorted(CHECKS))
def test_a_good_value_passes_and_the_same_value_with_a_newline_is_refused(what):
    CHECKS[what](GOOD[what])
    with pytest.raises((ValueError, LocalClusterError)):
        CHECKS[what](GOOD[what] + "\n")


@pytest.mark.parametrize("key,value", [("clusterName", "demo"), ("availabilityZone", "us-east-1a")])
def test_stack_values_with_a_newline_are_refused(key, value):
    spec(**{key: value})
    assert any(key in problem for problem in problems(**{key: value + "\n"}))


def test_a_checkpoint_folder_name_with_a_newline_is_no_checkpoint():
    assert step_of("checkpoint-20") == 20
    assert step_of("checkpoint-20\n") is None
