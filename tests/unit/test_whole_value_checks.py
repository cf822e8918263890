"""Every check of a whole value refuses a trailing newline.

A pattern ending in `$` also matches just before a final "\\n", so `ubuntu\\n` or `10.0.0.1\\n` would
pass a check and then break the line of the file or script it is written into. The checks below
guard values that reach file names, shell commands, rendezvous options and cluster config.
"""

from __future__ import annotations

import pytest

from cluster import names
from cluster.cost.calibration import cluster_file_name
from cluster.job.jobplan import check_job_id
from cluster.job.layout import plan_layout
from cluster.stack.catalog import CATALOG
from cluster.job.torchrun import check_program, plan_torchrun
from cluster.job.userjob import check_module
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
    "ssh user": names.user,
    "node alias": names.alias,
    "cluster name": lambda v: names.cluster(v),
    "host name": names.host,
    "IPv4 address": names.host,
    "IPv6 address": names.host,
    "endpoint port": names.endpoint,
    "node path": names.node_path,
}
GOOD = {
    "calibration cluster name": "local",
    "job id": "20261123-101500-ab12",
    "module name": "my_pkg.train",
    "program module": "training",
    "local cluster name": "demo",
    "rendezvous host": "10.0.0.2",
    "rendezvous id": "job1",
    "ssh user": "ubuntu",
    "node alias": "node0",
    "cluster name": "lab",
    "host name": "node-1.example.org",
    "IPv4 address": "10.0.0.1",
    "IPv6 address": "2001:db8::10",
    "endpoint port": "ops@bastion.example.org:2222",
    "node path": "/srv/wheels",
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


@pytest.mark.parametrize("what", ["ssh user", "node alias", "cluster name", "host name", "IPv4 address",
                                  "IPv6 address", "endpoint port", "node path"])
@pytest.mark.parametrize("inserted", ['"', "'", " ", "\t", "\r", "\n"])
def test_names_refuse_a_quote_a_space_or_a_line_break_anywhere(what, inserted):
    good = GOOD[what]
    for at in (0, len(good) // 2, len(good)):
        with pytest.raises(names.UnsafeValue, match="is not allowed; allowed: "):
            CHECKS[what](good[:at] + inserted + good[at:])


@pytest.mark.parametrize("zone", ["eth0", "eth0\nProxyCommand sh", 'x"', "a b", "1"])
def test_an_ipv6_address_with_a_zone_id_is_refused(zone):
    """`ipaddress` takes `fe80::1%<anything>`; the zone would reach ssh config, known_hosts and from=."""
    assert not names.is_ip(f"fe80::1%{zone}")
    with pytest.raises(names.UnsafeValue, match=r"allowed: an IP address \(no %zone\)"):
        names.host(f"fe80::1%{zone}")
    with pytest.raises(names.UnsafeValue):
        names.endpoint(f"ubuntu@fe80::1%{zone}")
    assert names.host("fe80::1") == "fe80::1"


@pytest.mark.parametrize("port", ["\u00b2", "\uff12\uff12", "\u0662\u0662", "22 ", "+22", "0", "65536"])
def test_a_port_is_ascii_digits_in_range(port):
    """str.isdigit takes superscripts and other scripts' digits; int() takes some of them, not all."""
    with pytest.raises(names.UnsafeValue, match=r"\(port\): .* allowed: a TCP port, 1 to 65535"):
        names.endpoint(f"bastion:{port}")
    assert names.endpoint("bastion:22") == "bastion:22"


@pytest.mark.parametrize("name", ["..", "../x", "a/../b", "a/b", "x..y", ".hidden", "-x", "a" * 65])
def test_a_cluster_name_cannot_climb_out_of_a_directory(name):
    with pytest.raises(names.UnsafeValue, match="cluster name: .* is not allowed; allowed: letters"):
        names.cluster(name)
