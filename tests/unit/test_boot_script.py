"""cluster/node/boot_script.py: a worker's first-boot script (the launch template's user data), its values
refused where they enter, and the script itself run as cloud-init runs it, into a temporary home."""

from __future__ import annotations

import getpass
import shutil
import stat
import subprocess

import pytest

from cluster.node import boot_script
from cluster.node.render import KEY_RESTRICTIONS, RenderError

CLUSTER = "demo"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICECnqlEndt9BEuNRtVWwmWQcvgQq/FYgx/iofqx4Int xeon-cluster:demo"
OLDER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA0bD6iqw9QJORGiKuSj49pzUqEWwNT8UlgbMDLHgwlQ xeon-cluster:demo"
CIDR = "172.31.16.0/20"
USER = getpass.getuser()


def run(script: str, tmp_path, home) -> subprocess.CompletedProcess:
    """Run the script as cloud-init does (by its shebang), with `home` as the directory to write into."""
    path = tmp_path / "user-data"
    path.write_text(script)
    path.chmod(0o700)
    return subprocess.run([str(path), str(home)], capture_output=True, text=True, timeout=30)


def test_the_line_is_limited_to_the_subnet_and_refuses_forwarding():
    assert boot_script.boot_key_line(KEY, CLUSTER, CIDR) == f'from="{CIDR}",{KEY_RESTRICTIONS} {KEY}'
    assert "no-port-forwarding" in KEY_RESTRICTIONS and "no-agent-forwarding" in KEY_RESTRICTIONS


@pytest.mark.parametrize("key", [
    "ssh-ed25519 AAAA xeon-cluster:demo\nssh-ed25519 BBBB evil",  # a second line
    'command="sh" ssh-ed25519 AAAA xeon-cluster:demo',  # an option smuggled in
    "ssh-ed25519 AAAA xeon-cluster:other",  # another cluster's key
    "",
])
def test_a_bad_key_is_refused_in_one_line_naming_it(key):
    with pytest.raises(RenderError) as caught:
        boot_script.boot_script(key, CLUSTER, CIDR, "ubuntu")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("cluster key: ") and repr(key.strip()[:20])[1:-1] in message


@pytest.mark.parametrize("cidr", ["172.31.16.1/20", "172.31.16.0/20,0.0.0.0/0", '172.31.16.0/20" evil', "0.0.0.0",
                                  "172.31.16.0/20\n", "2001:db8::/33x", "", None])
def test_a_bad_cidr_is_refused_in_one_line_naming_it(cidr):
    with pytest.raises(RenderError) as caught:
        boot_script.boot_script(KEY, CLUSTER, cidr, "ubuntu")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cluster subnet CIDR: {cidr!r} is not allowed; allowed: ")


def test_a_bad_user_or_cluster_name_is_refused_in_one_line():
    with pytest.raises(RenderError, match=r"^sshUser: 'ubuntu; rm' is not allowed"):
        boot_script.boot_script(KEY, CLUSTER, CIDR, "ubuntu; rm")
    with pytest.raises(RenderError, match=r"^cluster name: '\.\./x' is not allowed"):
        boot_script.boot_script(KEY, "../x", CIDR, "ubuntu")


def test_an_ipv6_subnet_is_taken():
    assert boot_script.boot_key_line(KEY, CLUSTER, "2001:db8:1::/64").startswith('from="2001:db8:1::/64",')


def test_the_script_writes_exactly_the_line_with_its_modes_and_a_second_run_changes_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    script = boot_script.boot_script(KEY, CLUSTER, CIDR, USER)
    first = run(script, tmp_path, home)
    assert first.returncode == 0, first.stderr
    keys = home / ".ssh" / "authorized_keys"
    assert keys.read_text() == f'from="{CIDR}",{KEY_RESTRICTIONS} {KEY}\n'
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600 and stat.S_IMODE(keys.parent.stat().st_mode) == 0o700
    assert first.stdout.strip() == f"xeon-cluster boot: cluster key written in {keys}"
    second = run(script, tmp_path, home)
    assert second.returncode == 0 and second.stdout.strip().endswith("unchanged in " + str(keys))
    assert keys.read_text().splitlines() == [f'from="{CIDR}",{KEY_RESTRICTIONS} {KEY}']


def test_an_older_cluster_key_line_is_replaced_and_every_other_line_kept(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text(f"ssh-ed25519 AAAAadmin admin@laptop\nfrom=\"10.0.0.5\",{KEY_RESTRICTIONS} {OLDER_KEY}\n")
    keys.chmod(0o644)
    done = run(boot_script.boot_script(KEY, CLUSTER, CIDR, USER), tmp_path, home)
    assert done.returncode == 0, done.stderr
    assert keys.read_text().splitlines() == ["ssh-ed25519 AAAAadmin admin@laptop",
                                             f'from="{CIDR}",{KEY_RESTRICTIONS} {KEY}']
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600


def test_a_missing_home_fails_and_writes_nothing(tmp_path):
    done = run(boot_script.boot_script(KEY, CLUSTER, CIDR, USER), tmp_path, tmp_path / "absent")
    assert done.returncode == 1 and "no home directory" in done.stderr
    assert not (tmp_path / "absent").exists()


def test_the_rendered_script_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: run scripts/setup-dev.sh (it apt-installs shellcheck)")
    script = boot_script.boot_script(KEY, CLUSTER, CIDR, USER)
    done = subprocess.run(["shellcheck", "--severity=style", "-"], input=script, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
