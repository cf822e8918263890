"""cluster/node/console.py: the host key blocks cloud-init prints on a node's console, and matching a presented key.

The keys are made here (ed25519, ECDSA P-256, RSA 3072) and their fingerprints computed by
`ssh-keygen -l` itself, so the parser is checked against the tool's own output, not against itself.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cluster.node.console import ConsoleHostKeys, describe, fingerprint, parse_console

pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen (openssh-client)")


@pytest.fixture(scope="module")
def host_keys(tmp_path_factory) -> dict[str, dict[str, str]]:
    """label -> {"line": "type base64", "keygen": `ssh-keygen -l` line} for three real host keys."""
    where = tmp_path_factory.mktemp("hostkeys")
    made = {}
    for kind, extra, label in (("ed25519", [], "ED25519"), ("ecdsa", ["-b", "256"], "ECDSA"),
                               ("rsa", ["-b", "3072"], "RSA")):
        path = where / f"ssh_host_{kind}_key"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, *extra, "-N", "", "-C", "root@ip-10-0-1-5", "-f", str(path)],
                       check=True)
        listed = subprocess.run(["ssh-keygen", "-l", "-f", f"{path}.pub"], check=True, capture_output=True,
                                text=True).stdout.strip()
        made[label] = {"line": " ".join(Path(f"{path}.pub").read_text().split()[:2]), "keygen": listed,
                       "pub": Path(f"{path}.pub").read_text().strip()}
    return made


def cloud_init_console(keys: dict[str, dict[str, str]], *, prefix: str = "<14>Mar  4 10:00:01 ec2: ") -> str:
    """An EC2 console as cloud-init leaves it: kernel lines, the fingerprints through logger (tagged
    ec2:), a kernel line in between, the keys block bare, CRLF line ends as the serial console has."""
    lines = ["[    0.000000] Linux version 6.8.0-1021-aws (buildd@lcy02-amd64-096) #23-Ubuntu SMP",
             "[   12.402114] cloud-init[812]: Cloud-init v. 24.4 running 'modules:final'",
             f"{prefix}", f"{prefix}#############################################################",
             f"{prefix}-----BEGIN SSH HOST KEY FINGERPRINTS-----"]
    lines += [f"{prefix}{keys[label]['keygen']}" for label in ("ECDSA", "ED25519")]
    lines += ["[   13.100001] audit: type=1400 apparmor=\"STATUS\" operation=\"profile_load\""]
    lines += [f"{prefix}{keys['RSA']['keygen']}", f"{prefix}-----END SSH HOST KEY FINGERPRINTS-----",
              f"{prefix}#############################################################",
              "-----BEGIN SSH HOST KEY KEYS-----"]
    lines += [keys[label]["pub"] for label in ("ECDSA", "ED25519", "RSA")]
    lines += ["-----END SSH HOST KEY KEYS-----",
              "[   13.522221] cloud-init[812]: Cloud-init v. 24.4 finished at Tue, 04 Mar 2025 10:00:01 +0000."]
    return "\r\n".join(lines) + "\r\n"


def test_fingerprint_is_ssh_keygens_for_every_key_type(host_keys):
    for label, key in host_keys.items():
        assert key["keygen"].split()[1] == fingerprint(key["line"].split()[1]), label


def test_a_cloud_init_console_gives_every_fingerprint_and_key(host_keys):
    shown = parse_console(cloud_init_console(host_keys))
    assert [(f.label, f.bits, f.comment) for f in shown.fingerprints] == [
        ("ECDSA", 256, "root@ip-10-0-1-5"), ("ED25519", 256, "root@ip-10-0-1-5"), ("RSA", 3072, "root@ip-10-0-1-5")]
    expected = [host_keys[k]["keygen"].split()[1] for k in ("ECDSA", "ED25519", "RSA")]
    assert [f.sha256 for f in shown.fingerprints] == expected
    assert shown.keys == tuple(host_keys[k]["line"] for k in ("ECDSA", "ED25519", "RSA"))
    assert all(shown.match(*key.split()) for key in shown.keys)  # every listed key is verified


@pytest.mark.parametrize("label", ["ED25519", "ECDSA", "RSA"])
def test_each_presented_key_type_matches_its_line(host_keys, label):
    shown = parse_console(cloud_init_console(host_keys))
    keytype, b64 = host_keys[label]["line"].split()
    found = shown.match(keytype, b64)
    assert found is not None and found.label == label


def test_lines_without_the_logger_tag_count_too(host_keys):
    """cloud-init versions (and our local nodes) differ in the prefix: bare `ec2: ` or none at all."""
    for prefix in ("ec2: ", ""):
        shown = parse_console(cloud_init_console(host_keys, prefix=prefix))
        assert len(shown.fingerprints) == 3, prefix


def test_another_key_is_not_matched(host_keys, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    keytype, b64 = (tmp_path / "other.pub").read_text().split()[:2]
    shown = parse_console(cloud_init_console(host_keys))
    assert shown.match(keytype, b64) is None
    assert describe(shown).count("SHA256:") == 3 and "(ED25519)" in describe(shown)


def test_no_fingerprints_yet(host_keys):
    assert parse_console("") == ConsoleHostKeys()
    assert parse_console("[    0.000000] Linux version 6.8.0\r\n[    1.0] booting\r\n").fingerprints == ()
    text = cloud_init_console(host_keys)
    unfinished = text[:text.index("-----END SSH HOST KEY FINGERPRINTS-----")]  # the block is still being printed
    assert parse_console(unfinished).fingerprints == ()
    assert describe(parse_console("")) == "no fingerprints"


def _other_key(tmp_path, kind: str = "ed25519", name: str = "other") -> tuple[str, str]:
    """("type base64", its `ssh-keygen -l` line) of a key made here: another machine's, or an attacker's."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "root@new", "-f", str(tmp_path / name)],
                   check=True)
    listed = subprocess.run(["ssh-keygen", "-l", "-f", str(tmp_path / f"{name}.pub")], check=True,
                            capture_output=True, text=True).stdout.strip()
    return " ".join((tmp_path / f"{name}.pub").read_text().split()[:2]), listed


def _block(*lines: str, prefix: str = "<14>Mar  4 11:00:01 ec2: ") -> str:
    return "".join(f"{prefix}{line}\r\n" for line in ("-----BEGIN SSH HOST KEY FINGERPRINTS-----", *lines,
                                                       "-----END SSH HOST KEY FINGERPRINTS-----"))


REBOOT = ("[    0.000000] Linux version 6.8.0-1021-aws (buildd@lcy02-amd64-096) #23-Ubuntu SMP\r\n"
          "[   11.902114] cloud-init[588]: Cloud-init v. 24.4 running 'init-local' at Tue, 04 Mar 2025 11:00:00"
          " +0000.\r\n")


def test_only_this_boots_block_counts(host_keys, tmp_path):
    """After a reboot with new host keys the console holds two boots: only the later boot's block counts."""
    new_line, listed = _other_key(tmp_path)
    shown = parse_console(cloud_init_console(host_keys) + REBOOT + _block(listed))
    assert [f.sha256 for f in shown.fingerprints] == [listed.split()[1]] and shown.conflicts == ()
    assert shown.match(*new_line.split()) is not None
    assert shown.match(*host_keys["ED25519"]["line"].split()) is None
    # rebooted, its block not printed yet: the earlier boot's block is not this boot's (wait for it)
    assert parse_console(cloud_init_console(host_keys) + REBOOT).fingerprints == ()
    assert parse_console(cloud_init_console(host_keys) + REBOOT.split("\r\n")[1]).fingerprints == ()


def test_a_forged_kernel_banner_does_not_start_a_boot_so_a_forged_block_after_it_pins_nothing(host_keys, tmp_path):
    """One `Linux version` line written to the console after cloud-init's block, then a block of another key:
    cloud-init marked no new boot, so the two blocks are one boot's and conflict; the forged key is not verified."""
    forged_line, listed = _other_key(tmp_path)
    shown = parse_console(cloud_init_console(host_keys) + REBOOT.split("\r\n")[0] + "\r\n" + _block(listed))
    assert shown.match(*forged_line.split()) is None and not any(shown.match(*k.split()) for k in shown.keys)
    assert shown.conflicts and shown.fingerprints[0].sha256 == host_keys["ECDSA"]["keygen"].split()[1]


def test_a_second_block_for_a_key_type_is_a_conflict_and_verifies_no_key(host_keys, tmp_path):
    """Text written to the console after cloud-init's block (root on the node) cannot pin another key."""
    forged_line, listed = _other_key(tmp_path)
    for later in (_block(listed), _block(listed, prefix="")):  # with cloud-init's tag, or bare
        shown = parse_console(cloud_init_console(host_keys) + later)
        assert [f.sha256 for f in shown.fingerprints] == [host_keys[k]["keygen"].split()[1]
                                                          for k in ("ECDSA", "ED25519", "RSA")]
        assert shown.conflicts == (f"ED25519 {host_keys['ED25519']['keygen'].split()[1]}, {listed.split()[1]}",)
        assert shown.match(*forged_line.split()) is None
        assert shown.match(*host_keys["ED25519"]["line"].split()) is None  # the real one is not trusted either
        assert shown.match(*host_keys["RSA"]["line"].split()) is None
        assert not any(shown.match(*k.split()) for k in shown.keys)
        assert describe(shown).startswith("conflicting fingerprints for one key type (ED25519 SHA256:")


def test_a_later_block_is_never_the_one_that_counts(host_keys, tmp_path):
    """A block printed after cloud-init's, for a key type cloud-init did not list, pins nothing."""
    console = cloud_init_console(host_keys).replace(host_keys["ECDSA"]["keygen"], "")  # a node without ECDSA
    forged_line, listed = _other_key(tmp_path, "ecdsa")
    shown = parse_console(console + _block(listed))
    assert shown.conflicts == () and [f.label for f in shown.fingerprints] == ["ED25519", "RSA"]
    assert shown.match(*forged_line.split()) is None


@pytest.mark.parametrize("prefix", ["[   13.200001] ", "", "<14>Mar  4 10:00:01 evil: "])
def test_a_fingerprint_line_behind_another_prefix_inside_the_block_is_skipped(host_keys, tmp_path, prefix):
    forged_line, listed = _other_key(tmp_path)
    text = cloud_init_console(host_keys)
    end = "<14>Mar  4 10:00:01 ec2: -----END SSH HOST KEY FINGERPRINTS-----"
    shown = parse_console(text.replace(end, f"{prefix}{listed}\r\n{end}"))
    assert len(shown.fingerprints) == 3 and shown.conflicts == ()
    assert shown.match(*forged_line.split()) is None and shown.match(*host_keys["ED25519"]["line"].split())


def test_a_key_not_in_the_fingerprint_block_is_not_verified(host_keys):
    text = cloud_init_console(host_keys)
    ed_line = next(line for line in text.split("\r\n") if host_keys["ED25519"]["keygen"] in line)
    shown = parse_console(text.replace(ed_line + "\r\n", ""))
    assert host_keys["ED25519"]["line"] in shown.keys
    assert shown.match(*host_keys["ED25519"]["line"].split()) is None


def test_junk_is_not_a_fingerprint():
    junk = ("-----BEGIN SSH HOST KEY FINGERPRINTS-----\n256 SHA256:short root@x (ED25519)\n"
            "256 MD5:aa:bb root@x (ED25519)\nnot a line\n-----END SSH HOST KEY FINGERPRINTS-----\n")
    assert parse_console(junk).fingerprints == ()
    assert fingerprint("not base64!") == ""


def test_the_supervisor_refuses_a_replacement_whose_console_conflicts(host_keys, tmp_path):
    """cluster/run/supervision.py's verdict on a replacement goes through this parse: a conflict is a refusal
    at once."""
    from cluster.run import supervision as sv

    member = sv.Member("node1", "10.0.0.3", "i-00000000000000aa")
    _, listed = _other_key(tmp_path)
    real = host_keys["ED25519"]["line"]
    assert sv.host_key_verdict(member, real, cloud_init_console(host_keys), waited_s=0).verified
    found = sv.host_key_verdict(member, real, cloud_init_console(host_keys) + _block(listed), waited_s=0)
    assert found.outcome == "refused" and "conflicting fingerprints for one key type (ED25519 " in found.line
