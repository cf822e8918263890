"""What `fab train --script/--module` does not copy to the nodes: dot-files and dot-folders, files
named like credentials, links that lead out of the workdir (cluster/job/userjob.py decides,
node_setup/ssh/workdir.py scans), the home folder and credentials folders (~/.aws, ~/.config ...)
refused as a workdir and the allow file that ships a withheld path on purpose."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.job.userjob import (INCLUDE_FILE, WITHHELD_CREDENTIAL, WITHHELD_DOT, WITHHELD_LINK, CopyPlan,
                             UserJobError, check_workdir, link_inside, parse_includes, withheld_reason)
from node_setup.ssh.workdir import scan
from tests.fab_run import Ran, fab_in_process

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = "name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10, 192.0.2.11]\n"
# A home-like folder: what a script saved in it would have shipped (fake values, no real secret)
HOME_LIKE = {
    "train.py": "print(1)\n", "lib/util.py": "x = 1\n", "data/train.csv": "a,b\n",
    ".aws/credentials": "[default]\naws_secret_access_key = fake\n", ".ssh/id_ed25519": "fake key\n",
    ".ssh/config": "Host *\n", ".env": "TOKEN=fake\n", ".config/gcloud/credentials.db": "fake",
    ".kaggle/kaggle.json": "{}", ".bash_history": "export TOKEN=fake\n",
    "keys/id_rsa": "fake key\n", "keys/server.pem": "fake\n", "conf/kaggle.json": "{}",
}


def make(folder: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


# ----------------------------------------------------------------------------- pure decisions


@pytest.mark.parametrize("path, reason", [
    ("train.py", None), ("lib/util.py", None), ("configs/app.yaml", None), ("id_rsa_notes.txt", "credential"),
    (".aws", "dot"), (".aws/credentials", "dot"), (".ssh/id_ed25519", "dot"), (".env", "dot"), (".env.local", "dot"),
    (".config/gcloud", "dot"), (".kaggle", "dot"), ("sub/.netrc", "dot"), ("a/.git-credentials", "dot"),
    ("keys/id_ed25519", "credential"), ("id_rsa", "credential"), ("tls/server.pem", "credential"),
    ("conf/kaggle.json", "credential"), ("credentials", "credential"), ("gcp/my-service-account-1.json", "credential"),
])
def test_dot_names_and_credential_names_are_withheld(path, reason):
    expected = {None: None, "dot": WITHHELD_DOT, "credential": WITHHELD_CREDENTIAL}[reason]
    assert withheld_reason(path) == expected


def test_the_allow_file_ships_a_listed_path_and_what_is_under_a_listed_folder():
    includes = parse_includes("# shipped on purpose\n.config/app.yaml\n.hydra/\n\nkeys/ca.pem\n")
    assert includes == (".config/app.yaml", ".hydra", "keys/ca.pem")
    assert withheld_reason(".config/app.yaml", includes) is None
    assert withheld_reason(".hydra/config.yaml", includes) is None
    assert withheld_reason("keys/ca.pem", includes) is None
    assert withheld_reason(".config/other.yaml", includes) == WITHHELD_DOT  # only what is listed
    assert withheld_reason("keys/server.pem", includes) == WITHHELD_CREDENTIAL


@pytest.mark.parametrize("line", ["/etc/passwd", "../outside", "a/../../b", "*.pem", ".ssh/id_*"])
def test_the_allow_file_refuses_absolute_climbing_and_wildcard_paths(line):
    with pytest.raises(UserJobError, match=rf"^--workdir: {INCLUDE_FILE} line 2: .* is not allowed; list paths "):
        parse_includes(f"ok.txt\n{line}\n")


@pytest.mark.parametrize("target, inside", [
    ("/home/u/proj/data/x.csv", "data/x.csv"), ("/home/u/proj", "."), ("/home/u/.aws/credentials", None),
    ("/home/u/project-other/x", None), ("/etc/passwd", None), ("/home/u", None),
])
def test_a_link_is_inside_the_workdir_only_when_its_target_is(target, inside):
    assert link_inside("/home/u/proj", target) == inside


@pytest.mark.parametrize("workdir, refused", [
    ("/home/u", True), ("/home", True), ("/", True), ("/home/u/proj", False), ("/home/u2", False),
    ("/srv/work", False),
])
def test_the_home_folder_or_a_folder_above_it_is_refused_as_a_workdir(workdir, refused):
    if refused:
        with pytest.raises(UserJobError, match=rf"^--workdir: {workdir} is your home folder or holds it"):
            check_workdir(workdir, "/home/u")
    else:
        assert check_workdir(workdir, "/home/u") == workdir


@pytest.mark.parametrize("workdir, found", [
    ("/home/u/.aws", "is .aws"), ("/home/u/.aws/sso/cache", "lies inside .aws"), ("/home/u/.ssh", "is .ssh"),
    ("/home/u/.config", "holds .config/gcloud"), ("/home/u/.config/gcloud", "is .config/gcloud"),
    ("/home/u/.config/gcloud/legacy_credentials", "lies inside .config/gcloud"), ("/home/u/.kube", "is .kube"),
    ("/home/u/.docker", "is .docker"), ("/home/u/.azure", "is .azure"), ("/home/u/.gnupg", "is .gnupg"),
    ("/home/u/.cache", "holds .cache/huggingface"), ("/mnt/backup/alice/.aws", "is .aws"),
    ("/home/u/.local/share", "holds .local/share/keyrings"),
])
def test_a_credentials_folder_is_refused_as_a_workdir_by_name(workdir, found):
    with pytest.raises(UserJobError, match=rf"^--workdir: {workdir} {found}, a folder of credentials, and would copy "
                                           r"them to every node; allowed: a folder of the project"):
        check_workdir(workdir, "/home/u")


@pytest.mark.parametrize("workdir", ["/home/u/.config/myapp", "/home/u/projects/aws", "/home/u/kube-demo",
                                     "/srv/docker-build", "/home/u/.cache/pip-project"])
def test_a_folder_beside_or_named_like_a_tool_is_not_a_credentials_folder(workdir):
    assert check_workdir(workdir, "/home/u") == workdir


@pytest.mark.parametrize("path", [
    "sso/cache/0123abcd.json", "backup/aws/cli/cache/x.json", "aws/config", "application_default_credentials.json",
    "gcloud/credentials.db", "gcloud/access_tokens.db", "gcloud/legacy_credentials", "azure/msal_token_cache.json",
    "azure/accessTokens.json", "kube/config", "clusters/prod.kubeconfig", "kubeconfig.yaml", "docker/config.json",
    "gh/hosts.yml", "huggingface/token", "rclone/rclone.conf", "terraform.d/credentials.tfrc.json",
])
def test_well_known_credential_files_are_withheld_wherever_they_are(path):
    assert withheld_reason(path) == WITHHELD_CREDENTIAL


@pytest.mark.parametrize("path", ["config", "configs/config.yaml", "cache/x.json", "docker/Dockerfile", "kube/job.yaml",
                                  "token_utils.py", "data/tokens.json"])
def test_ordinary_project_files_beside_them_ship(path):
    assert withheld_reason(path) is None


def test_the_plan_lists_what_it_withheld_by_kind_and_how_to_ship_one():
    plan = CopyPlan("/w", (), withheld=tuple((f".d{i}/", WITHHELD_DOT) for i in range(25))
                    + (("link.txt", WITHHELD_LINK), ("k/id_rsa", WITHHELD_CREDENTIAL)))
    full, short = plan.describe(), plan.withheld_lines(20)
    assert any(line.startswith(f"  not copied, {WITHHELD_DOT}: .d0/, .d1/") and ".d9/" in line for line in full)
    assert f"  not copied, {WITHHELD_LINK}: link.txt" in full
    assert f"  not copied, {WITHHELD_CREDENTIAL}: k/id_rsa" in full
    assert any(INCLUDE_FILE in line and "never copied" in line for line in full)
    assert "and 5 more (--dry-run lists all)" in short[0] and ".d9/" not in short[0]  # sorted: .d10 ... .d19 ...


# ----------------------------------------------------------------------------- the scan (real files)


def test_a_home_like_workdir_ships_no_credential_and_follows_no_link_out(tmp_path):
    work = make(tmp_path / "work", HOME_LIKE)
    outside = make(tmp_path / "outside", {"secret.txt": "fake secret\n", "dir/x.txt": "x"})
    (work / "leak.txt").symlink_to(outside / "secret.txt")
    (work / "leakdir").symlink_to(outside / "dir")
    (work / "lib" / "creds").symlink_to(work / ".aws" / "credentials")  # inside, but to a withheld file
    (work / "lib" / "same.py").symlink_to(work / "lib" / "util.py")  # inside, to a shipped file: shipped
    plan = scan(work)
    assert sorted(f.path for f in plan.files) == ["data/train.csv", "lib/same.py", "lib/util.py", "train.py"]
    assert dict(plan.withheld) == {
        ".aws/": WITHHELD_DOT, ".ssh/": WITHHELD_DOT, ".env": WITHHELD_DOT, ".config/": WITHHELD_DOT,
        ".kaggle/": WITHHELD_DOT, ".bash_history": WITHHELD_DOT, "keys/id_rsa": WITHHELD_CREDENTIAL,
        "keys/server.pem": WITHHELD_CREDENTIAL, "conf/kaggle.json": WITHHELD_CREDENTIAL,
        "leak.txt": WITHHELD_LINK, "leakdir/": WITHHELD_LINK, "lib/creds": WITHHELD_DOT}
    assert "fake" not in plan.manifest()


def test_the_allow_file_ships_what_it_lists_and_never_a_link_out(tmp_path):
    work = make(tmp_path / "work", {"train.py": "", ".config/app.yaml": "a: 1\n", ".config/other": "",
                                    ".hydra/config.yaml": "", "keys/ca.pem": "",
                                    INCLUDE_FILE: ".config/app.yaml\n.hydra/\nkeys/ca.pem\nleak.txt\n"})
    (tmp_path / "secret.txt").write_text("fake")
    (work / "leak.txt").symlink_to(tmp_path / "secret.txt")
    plan = scan(work)
    assert sorted(f.path for f in plan.files) == [".config/app.yaml", ".hydra/config.yaml", "keys/ca.pem", "train.py"]
    assert dict(plan.withheld) == {".config/other": WITHHELD_DOT, INCLUDE_FILE: WITHHELD_DOT,
                                   "leak.txt": WITHHELD_LINK}


def test_the_scan_refuses_the_home_folder_before_reading_it(tmp_path, monkeypatch):
    make(tmp_path, {"train.py": "", ".aws/credentials": "fake"})
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(UserJobError, match="is your home folder or holds it"):
        scan(tmp_path)
    with pytest.raises(UserJobError, match="is your home folder or holds it"):
        scan(tmp_path.parent)


# ----------------------------------------------------------------------------- fab train (dry run, no node)


def fab(tmp_path: Path, *argv: str) -> Ran:
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    return fab_in_process("train", *argv, "--dry-run", "-c", str(tmp_path / "lab.yaml"),
                          env={**os.environ, "HOME": str(tmp_path / "home")})


def test_fab_train_refuses_a_script_in_the_home_folder_in_one_line_with_exit_2(tmp_path):
    home = make(tmp_path / "home", {"train.py": "print(1)\n", ".aws/credentials": "fake"})
    result = fab(tmp_path, "--script", str(home / "train.py"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: --workdir: {home.resolve()} is your home folder or holds it, and would copy all of it to every "
        "node; allowed: a folder of the project, e.g. move the script into a folder of its own or pass "
        "--workdir PROJECT_FOLDER"]


@pytest.mark.parametrize("folder, found", [(".aws", "is .aws"), (".config", "holds .config/gcloud"),
                                           (".kube", "is .kube"), (".docker", "is .docker")])
def test_fab_train_refuses_a_credentials_folder_as_the_workdir_in_one_line_with_exit_2(tmp_path, folder, found):
    # what the tools keep there (fake values): none of it is named like a dot-file below the folder
    home = make(tmp_path / "home", {".aws/sso/cache/0123.json": "{}", ".aws/cli/cache/0123.json": "{}",
                                    ".aws/config": "[default]\n", ".kube/config": "users: []\n",
                                    ".docker/config.json": "{}", ".config/gcloud/credentials.db": "fake",
                                    ".config/gcloud/application_default_credentials.json": "{}",
                                    ".config/gcloud/access_tokens.db": "fake"})
    result = fab(tmp_path, "--module", "train", "--workdir", str(home / folder))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: --workdir: {(home / folder).resolve()} {found}, a folder of credentials, and would copy them to "
        "every node; allowed: a folder of the project, e.g. move the script into a folder of its own or pass "
        "--workdir PROJECT_FOLDER"] and "copy plan" not in result.stdout


def test_a_copy_of_the_tools_folders_inside_a_workdir_ships_none_of_their_credentials(tmp_path):
    work = make(tmp_path / "work", {
        "train.py": "", "backup/aws/sso/cache/0123.json": "{}", "backup/aws/cli/cache/0123.json": "{}",
        "backup/aws/config": "[default]\n", "gcloud/application_default_credentials.json": "{}",
        "gcloud/credentials.db": "fake", "gcloud/access_tokens.db": "fake",
        "gcloud/legacy_credentials/me/adc.json": "{}",
        "kube/config": "users: []\n", "docker/config.json": "{}", "docker/Dockerfile": "FROM x\n"})
    plan = scan(work)
    assert sorted(f.path for f in plan.files) == ["docker/Dockerfile", "train.py"]
    assert {p for p, kind in plan.withheld if kind == WITHHELD_CREDENTIAL} == {
        "backup/aws/sso/cache/0123.json", "backup/aws/cli/cache/0123.json", "backup/aws/config",
        "gcloud/application_default_credentials.json", "gcloud/credentials.db", "gcloud/access_tokens.db",
        "gcloud/legacy_credentials/", "kube/config", "docker/config.json"}


def test_fab_train_dry_run_lists_what_would_be_copied_and_what_would_not(tmp_path):
    work = make(tmp_path / "home" / "proj", HOME_LIKE)
    (work / "leak.txt").symlink_to(tmp_path / "lab.yaml")
    result = fab(tmp_path, "--script", str(work / "train.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "copy plan: 3 file(s)" in out and "  train.py  " in out and "  data/train.csv  " in out, out
    assert (f"  not copied, {WITHHELD_DOT}: .aws/, .bash_history, .config/, .env, .kaggle/, .ssh/\n"
            f"  not copied, {WITHHELD_CREDENTIAL}: conf/kaggle.json, keys/id_rsa, keys/server.pem\n"
            f"  not copied, {WITHHELD_LINK}: leak.txt\n"
            f"  to copy a path that is not copied on purpose, list it (one a line) in {INCLUDE_FILE}") in out, out


KEY_BODY = "\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
PRIVATE_KEYS = {  # a private key of each common format under a name no rule withholds
    "notes/openssh.txt": f"-----BEGIN OPENSSH PRIVATE KEY-----{KEY_BODY}-----END OPENSSH PRIVATE KEY-----\n",
    "notes/rsa.txt": f"-----BEGIN RSA PRIVATE KEY-----{KEY_BODY}-----END RSA PRIVATE KEY-----\n",
    "notes/ec.txt": f"-----BEGIN EC PRIVATE KEY-----{KEY_BODY}-----END EC PRIVATE KEY-----\n",
    "notes/dsa.txt": f"-----BEGIN DSA PRIVATE KEY-----{KEY_BODY}-----END DSA PRIVATE KEY-----\n",
    "notes/pkcs8.txt": f"-----BEGIN PRIVATE KEY-----{KEY_BODY}-----END PRIVATE KEY-----\n",
    "notes/encrypted.txt": f"-----BEGIN ENCRYPTED PRIVATE KEY-----{KEY_BODY}-----END ENCRYPTED PRIVATE KEY-----\n",
    "notes/putty.txt": "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n",
    "notes/private.asc": f"-----BEGIN PGP PRIVATE KEY BLOCK-----{KEY_BODY}-----END PGP PRIVATE KEY BLOCK-----\n",
    "conf/sa-key.json": '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIE\\n"}\n',
}


def test_a_file_holding_a_private_key_is_withheld_by_its_content_whatever_its_name(tmp_path):
    from cluster.job.userjob import WITHHELD_KEY

    work = make(tmp_path / "work", {"train.py": "print(1)\n", "notes/public.txt": "-----BEGIN PUBLIC KEY-----\n",
                                    **PRIVATE_KEYS, "deploy_key": "x", "etc/ssh_host_ed25519_key": "x",
                                    "key.ppk": "x", "infra/terraform.tfstate": "{}"})
    plan = scan(work)
    assert sorted(f.path for f in plan.files) == ["notes/public.txt", "train.py"]
    assert {p for p, k in plan.withheld if k == WITHHELD_KEY} == set(PRIVATE_KEYS)
    assert {p for p, k in plan.withheld if k == WITHHELD_CREDENTIAL} == {
        "deploy_key", "etc/ssh_host_ed25519_key", "key.ppk", "infra/terraform.tfstate"}
    (work / INCLUDE_FILE).write_text("notes/rsa.txt\n")  # shipped on purpose when the allow file lists it
    assert "notes/rsa.txt" in {f.path for f in scan(work).files}
