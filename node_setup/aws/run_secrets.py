"""A supervised run's secret store on AWS: Systems Manager Parameter Store, SecureString parameters under
`/xeon-cluster/<cluster>/` (cluster/run/runspec.py names them: the cluster's private SSH key, one record per run;
the KMS key is the account's default `aws/ssm` key), where the secrets outlive the master and only the master's
role reads them. The controller writes them at the hand-off (PutParameter); a new master's boot step
(node_setup/supervisor/boot.py) reads them (GetParameter and GetParametersByPath with decryption) and the run's
spec and mirrored state in S3 beside its checkpoints. Tested with moto's SSM and S3
(tests/unit/test_run_store.py); not run against AWS here. Its local stand-in: node_setup/local/run_store_double.py.
"""

from __future__ import annotations

from cluster.run import runspec
from node_setup.aws import clients, errors
from node_setup.aws import run_spec as s3_text


class SsmStore:
    """SSM Parameter Store SecureString parameters under the cluster's prefix (see the module's docstring)."""

    def __init__(self, cluster: str, region: str | None = None, client=None):
        self.prefix, self.region, self._client = runspec.store_prefix(cluster), region, client

    def _ssm(self):
        if self._client is None:
            self._client = clients.client("ssm", self.region)
        return self._client

    def where(self, name: str) -> str:
        return f"ssm:{self.prefix}/{name}"

    def put(self, name: str, text: str) -> None:
        try:
            self._ssm().put_parameter(Name=f"{self.prefix}/{name}", Value=text, Type="SecureString", Overwrite=True)
        except errors.AWS_ERRORS as exc:
            raise runspec.StoreError(f"{self.where(name)}: not written ({errors.describe(exc)})") from None

    def get(self, name: str) -> str | None:
        try:
            return self._ssm().get_parameter(Name=f"{self.prefix}/{name}", WithDecryption=True)["Parameter"]["Value"]
        except errors.AWS_ERRORS as exc:
            if errors.code(exc) == "ParameterNotFound":
                return None
            raise runspec.StoreError(f"{self.where(name)}: not read ({errors.describe(exc)})") from None

    def names(self, folder: str) -> list[str]:
        found, start = [], f"{self.prefix}/"
        try:
            pages = self._ssm().get_paginator("get_parameters_by_path").paginate(
                Path=f"{self.prefix}/{folder}", Recursive=False, WithDecryption=False)
            for page in pages:
                found += [p["Name"][len(start):] for p in page.get("Parameters", []) if p["Name"].startswith(start)]
        except errors.AWS_ERRORS as exc:
            raise runspec.StoreError(f"{self.where(folder)}: not listed ({errors.describe(exc)})") from None
        return sorted(found)

    def delete(self, name: str) -> None:
        try:
            self._ssm().delete_parameter(Name=f"{self.prefix}/{name}")
        except errors.AWS_ERRORS as exc:
            if errors.code(exc) != "ParameterNotFound":
                raise runspec.StoreError(f"{self.where(name)}: not removed ({errors.describe(exc)})") from None

    def write(self, where: str, text: str) -> None:
        """A run's state mirrored beside its spec in S3 (`where`: an s3:// URI); runspec.StoreError when not."""
        why = s3_text.put(where, text, region=self.region)
        if why is not None:
            raise runspec.StoreError(f"{where}: not written ({why})")

    def read(self, where: str) -> str | None:
        """The text of a run's spec or mirrored state at `where` (beside its checkpoints in S3)."""
        return s3_text.get(where, region=self.region)[0]
