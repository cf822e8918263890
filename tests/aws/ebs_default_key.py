"""Test double for EC2's GetEbsDefaultKmsKeyId, which moto 5 does not implement (it implements
ModifyEbsDefaultKmsKeyId and keeps the key it was given): installed on moto's EC2 responses, in-process
(`install(monkeypatch)`) or for the rehearsal's moto server (`install_for_good()`, the server lives in the
test's process). It answers what AWS answers: the key ModifyEbsDefaultKmsKeyId set, else alias/aws/ebs, the
AWS managed key of an account that never set one."""

from __future__ import annotations

from moto.core.responses import ActionResult
from moto.ec2.responses.elastic_block_store import ElasticBlockStore

AWS_MANAGED_KEY = "alias/aws/ebs"


def get_ebs_default_kms_key_id(self) -> ActionResult:
    return ActionResult({"KmsKeyId": self.ec2_backend.default_kms_key_id or AWS_MANAGED_KEY})


def install(monkeypatch) -> None:
    monkeypatch.setattr(ElasticBlockStore, "get_ebs_default_kms_key_id", get_ebs_default_kms_key_id, raising=False)


def install_for_good() -> None:
    """For a moto server this process runs until it ends (the rehearsal)."""
    ElasticBlockStore.get_ebs_default_kms_key_id = get_ebs_default_kms_key_id  # type: ignore[attr-defined]
