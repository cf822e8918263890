"""The toolkit's per-cluster files on the controller: the cluster's SSH key pair and known_hosts, and the
key that signs supervised runs' specs.

    ${XDG_CONFIG_HOME:-~/.config}/xeon-cluster/keys/<cluster>/       (0700)
        id_ed25519        private half of the cluster key (0600): goes to the master only
        id_ed25519.pub    public half: in every node's authorized_keys (from= the cluster's addresses)
        known_hosts       every node's host key as the controller verified it (see connections.py)
    ${XDG_CONFIG_HOME:-~/.config}/xeon-cluster/keys/run-spec-ed25519     (0600; `spec_key`: never leaves this machine)
    ${XDG_CONFIG_HOME:-~/.config}/xeon-cluster/keys/run-spec-ed25519.pub  (its public half: a new master verifies)

The key pair is made once per cluster by the toolkit (ed25519, with `cryptography`, which
paramiko already needs) and reused on later runs, so `fab distribute` stays idempotent. It never
lives in the repository (refused if the config directory points inside it) and never reaches an
image: the image is built apart on an instance that never held it (infra/image.py). Its
authorized_keys lines' comment is `xeon-cluster:<cluster>`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cluster import names
from cluster.node.render import key_comment
from node_setup.controller import KEY_STORE_DIR, PROJECT_ROOT, SPEC_KEY_FILE, config_root
from node_setup.spec_signing import SpecKey


class KeyStoreError(RuntimeError):
    """The per-cluster key store cannot be used; the message says what to do."""


def cluster_dir(cluster: str, *, create: bool = True) -> Path:
    """The cluster's directory under the config root (made 0700 when `create`)."""
    try:
        names.cluster(cluster)
    except names.UnsafeValue as exc:
        raise KeyStoreError(str(exc)) from None
    path = config_root() / KEY_STORE_DIR / cluster
    resolved = path.resolve()
    if resolved == PROJECT_ROOT or PROJECT_ROOT in resolved.parents:
        raise KeyStoreError(f"key directory {path} lies inside the project checkout {PROJECT_ROOT}; keys must never "
                            "be in the repository: set XDG_CONFIG_HOME to a directory outside it (default ~/.config)")
    if create:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.chmod(0o700)
    return path


@dataclass(frozen=True)
class ClusterKey:
    cluster: str
    private_path: Path
    public_path: Path

    @property
    def public_key(self) -> str:
        """`ssh-ed25519 AAAA... xeon-cluster:<cluster>` (one line, no newline)."""
        return self.public_path.read_text().strip()

    @property
    def private_key(self) -> str:
        return self.private_path.read_text()


def _write_new(path: Path, data: bytes, mode: int) -> bool:
    """Create `path` with `mode` unless it exists (atomic against a concurrent fab); True if made."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return True


def ensure_cluster_key(cluster: str) -> ClusterKey:
    """The cluster's key pair, made on first use (ed25519, no passphrase, private half 0600)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    directory = cluster_dir(cluster)
    key = ClusterKey(cluster, directory / "id_ed25519", directory / "id_ed25519.pub")
    lock = os.open(directory, os.O_RDONLY)  # the directory itself is the lock: no file of its own left behind
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another fab making the pair now: wait for both halves
        if key.private_path.exists() and key.public_path.exists():
            key.private_path.chmod(0o600)
            return key
        if key.private_path.exists() != key.public_path.exists():
            there, missing = ((key.private_path, key.public_path) if key.private_path.exists()
                              else (key.public_path, key.private_path))
            raise KeyStoreError(f"cluster key of {cluster!r}: {there} is only one half of the pair ({missing.name} "
                                f"is missing); remove {there} and rerun: a new pair is made, and the nodes get its "
                                "public half on the next `fab distribute`")
        private = Ed25519PrivateKey.generate()
        private_bytes = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption())
        public = private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                   serialization.PublicFormat.OpenSSH)
        if _write_new(key.private_path, private_bytes, 0o600):
            key.public_path.write_text(public.decode() + f" {key_comment(cluster)}\n")
            key.public_path.chmod(0o644)
    finally:
        os.close(lock)  # closing the last descriptor releases the lock
    return key


def known_hosts_path(cluster: str) -> Path:
    """The controller's known_hosts for this cluster (made empty, 0600, on first use)."""
    path = cluster_dir(cluster) / "known_hosts"
    if not path.exists():
        _write_new(path, b"", 0o600)
    return path


def forget_cluster(cluster: str) -> bool:
    """Remove the cluster's key pair and known_hosts (after `pulumi destroy` / `fab local-down`)."""
    directory = cluster_dir(cluster, create=False)
    if not directory.exists():
        return False
    shutil.rmtree(directory)
    return True


def _names_host(pattern: str, host: str) -> bool:
    """Whether a known_hosts host entry is `host`: the same text, or `[host]:port` when `host` is bare
    (off port 22 known_hosts records `[address]:port`, while paramiko's errors name the bare address)."""
    return pattern == host or (not host.startswith("[") and pattern.startswith(f"[{host}]:"))


def forget_host(cluster: str, host: str) -> int:
    """Remove every known_hosts line of `host` (an address: on any port; `[address]:port`: that port only);
    returns how many."""
    path = cluster_dir(cluster, create=False) / "known_hosts"
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if not any(_names_host(p, host) for p in line.split(" ", 1)[0].split(","))]
    path.write_text("".join(f"{line}\n" for line in kept))
    return len(lines) - len(kept)


def forget_hint(cluster: str, host: str) -> str:
    """What to run when a recorded host key no longer matches (the node was replaced or its address reused)."""
    return (f"if the node was replaced or cluster {cluster!r} was made again, forget the old key with "
            f"`fab forget --cluster {cluster} --host {host}` (or the whole cluster: `fab forget --cluster {cluster}`) "
            "and rerun; otherwise do not connect")


def _spec_key_path() -> Path:
    """SPEC_KEY_FILE in the key store's root (0700, made here), never inside the checkout."""
    root = config_root() / KEY_STORE_DIR
    resolved = root.resolve()
    if resolved == PROJECT_ROOT or PROJECT_ROOT in resolved.parents:
        raise KeyStoreError(f"key directory {root} lies inside the project checkout {PROJECT_ROOT}; keys must never "
                            "be in the repository: set XDG_CONFIG_HOME to a directory outside it (default ~/.config)")
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    root.chmod(0o700)
    return root / SPEC_KEY_FILE


def _make_spec_key(path: Path) -> bool:
    """An Ed25519 pair at `path` (private, 0600, OpenSSH format) and `path`.pub, unless the private half exists."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    made = _write_new(path, private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                  serialization.NoEncryption()), 0o600)
    if made:
        public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        partial = path.with_name(path.name + ".pub.new")
        partial.write_text(public.decode() + " xeon-cluster-run-spec\n")
        os.replace(partial, path.with_name(path.name + ".pub"))
    return made


def rotate_spec_key() -> Path:
    """A new spec key pair in place of the old (`fab forget --spec-key`): made beside it, then moved over it, so
    that every spec signed before is refused from now on. Returns the private half's file."""
    path = _spec_key_path()
    new = path.with_name(f"{SPEC_KEY_FILE}.new")
    new.unlink(missing_ok=True)
    _make_spec_key(new)
    os.replace(new.with_name(new.name + ".pub"), path.with_name(path.name + ".pub"))
    os.replace(new, path)
    return path


def spec_key() -> SpecKey:
    """The key pair that signs supervised runs' specs (cluster/run/runspec.py, node_setup/spec_signing.py): an
    Ed25519 pair made on first use, its private half 0600 in the key store (0700) and never sent anywhere; its
    public half goes to the master's boot step, so a new master verifies the spec too, and a spec read back from
    a bucket the nodes may write is refused unless this controller signed it."""
    from node_setup.spec_signing import checked_public_key

    path = _spec_key_path()
    public = path.with_name(path.name + ".pub")
    if not path.exists():
        _make_spec_key(path)
    path.chmod(0o600)
    try:
        return SpecKey(checked_public_key(public.read_text()), path)
    except (OSError, ValueError):
        raise KeyStoreError(f"{path}: not the Ed25519 pair fab writes there ({public.name} beside it); remove both "
                            "and rerun (a new pair is made; specs signed with the old one can no longer be "
                            "resumed)") from None
