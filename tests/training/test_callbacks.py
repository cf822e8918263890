"""SpotCheckpointCallback in one process: what a rebalance recommendation, an interruption notice,
a failed upload and a full disk do (no process group: the all-reduce is the identity)."""

from types import SimpleNamespace as NS

import pytest
from transformers import TrainerControl

from training import checkpoints
from training.callbacks import SpotCheckpointCallback


def trainer_args(output_dir):
    """The TrainingArguments fields the callback reads (a batch of 8 on this one rank)."""
    return NS(output_dir=str(output_dir), per_device_train_batch_size=8, gradient_accumulation_steps=1)


def step(callback, global_step):
    control = TrainerControl()
    callback.on_step_end(NS(), NS(global_step=global_step), control)
    return control


def test_a_rebalance_recommendation_saves_once_and_training_goes_on():
    watcher = NS(notice=None, rebalance='{"noticeTime": "2026-01-01T00:00:00Z"}')
    callback = SpotCheckpointCallback(rank=0, watcher=watcher)
    first, second, third = step(callback, 5), step(callback, 6), step(callback, 7)
    assert first.should_save and not first.should_training_stop
    assert not second.should_save and not third.should_save
    assert callback.interrupted_at is None and callback.rebalance_at == 5


def test_an_interruption_notice_saves_and_stops():
    watcher = NS(notice='{"action": "terminate"}', rebalance=None)
    callback = SpotCheckpointCallback(rank=0, watcher=watcher)
    control = step(callback, 9)
    assert control.should_save and control.should_training_stop
    assert callback.interrupted_at == 9 and callback.notice_rank == 0


def test_a_failed_upload_is_recorded_and_training_goes_on(tmp_path):
    def no_s3():
        raise ConnectionError("endpoint unreachable")

    directory = tmp_path / "checkpoint-4"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"w" * 10)
    callback = SpotCheckpointCallback(rank=0, checkpoint_uri="s3://ckpt/run", s3_client_factory=no_s3,
                                      run_id="run-a", keep=2)
    callback.on_save(trainer_args(tmp_path), NS(global_step=4, best_model_checkpoint=None), TrainerControl())
    [record] = callback.saved
    assert record["step"] == 4 and record["uri"] is None
    assert record["upload_error"] == "ConnectionError: endpoint unreachable"
    assert checkpoints.read_manifest(directory)["run_id"] == "run-a"


# ---- a checkpoint the disk could not hold


def test_a_save_that_failed_for_want_of_space_is_told_from_any_other_failure(tmp_path, monkeypatch):
    import errno

    folder = tmp_path / "checkpoint-40"
    assert checkpoints.disk_full(OSError(errno.ENOSPC, "No space left on device"), folder)
    try:  # safetensors' own error, with the OS error as its cause
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as cause:
            raise RuntimeError("Error while serializing") from cause
    except RuntimeError as exc:
        assert checkpoints.disk_full(exc, folder)
    assert checkpoints.disk_full(RuntimeError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
                                              'device" })'), folder)
    written = RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")  # torch.save: no cause named; the free space tells
    monkeypatch.setattr(checkpoints, "free_bytes", lambda directory: 256 * 1024)
    assert "(256 KiB free)" in checkpoints.disk_full(written, folder)
    monkeypatch.setattr(checkpoints, "free_bytes", lambda directory: 40 * 1024 ** 3)
    assert checkpoints.disk_full(written, folder) is None
    assert checkpoints.disk_full(ValueError("a bug in the save"), folder) is None
    assert checkpoints.disk_full(OSError(errno.EACCES, "Permission denied"), folder) is None


def _folder(tmp_path, step):
    directory = tmp_path / f"checkpoint-{step}"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"w" * 10)
    return directory


def test_a_checkpoint_the_full_disk_could_not_hold_is_no_checkpoint_and_training_goes_on(tmp_path, caplog):
    callback = SpotCheckpointCallback(rank=0, run_id="run-a", keep=2)
    args = trainer_args(tmp_path)
    _folder(tmp_path, 20)
    callback.on_save(args, NS(global_step=20, best_model_checkpoint=None), TrainerControl())
    half = _folder(tmp_path, 40)  # the trainer wrote part of it, then the disk was full
    callback.not_saved("no space left on the device of /out/checkpoint-40 (256 KiB free)")
    control = callback.on_save(args, NS(global_step=40, best_model_checkpoint=None), TrainerControl())
    assert not half.exists() and not control.should_training_stop
    assert [f.step for f in checkpoints.local_checkpoints(tmp_path)] == [20]  # the one before stays the newest
    assert callback.saved[-1] == {"step": 40, "path": None, "uri": None, "upload_error": None,
                                  "save_error": "no space left on the device of /out/checkpoint-40 (256 KiB free)"}
    assert "checkpoint 40 not saved: no space left" in caplog.text
    _folder(tmp_path, 60)  # the disk has room again: the next one is saved as usual
    callback.on_save(args, NS(global_step=60, best_model_checkpoint=None), TrainerControl())
    assert [f.step for f in checkpoints.local_checkpoints(tmp_path)] == [20, 60]


def test_a_manifest_the_full_disk_could_not_hold_leaves_no_checkpoint(tmp_path, monkeypatch):
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    callback = SpotCheckpointCallback(rank=0, run_id="run-a")
    directory = _folder(tmp_path, 8)
    monkeypatch.setattr(checkpoints, "write_manifest", full)
    callback.on_save(trainer_args(tmp_path), NS(global_step=8, best_model_checkpoint=None), TrainerControl())
    assert not directory.exists() and callback.saved[-1]["save_error"].startswith("no space left")

    def refused(*args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(checkpoints, "write_manifest", refused)
    monkeypatch.setattr(checkpoints, "free_bytes", lambda directory: 40 * 1024 ** 3)
    _folder(tmp_path, 9)
    with pytest.raises(PermissionError):  # not the disk's: the job fails and says so
        callback.on_save(trainer_args(tmp_path), NS(global_step=9, best_model_checkpoint=None), TrainerControl())


def test_the_final_model_waits_for_a_full_disk_to_have_space_and_any_other_failure_is_raised(tmp_path, caplog):
    import errno

    attempts, slept = [], []

    def save():  # full twice, then written
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')
        return "saved"

    assert checkpoints.when_space(save, tmp_path, "the final model", sleep=slept.append) == "saved"
    assert len(attempts) == 3 and slept == [checkpoints.SPACE_POLL_S] * 2
    assert caplog.text.count("the final model waits for space: no space left") == 1  # said once

    def never():
        raise OSError(errno.ENOSPC, "No space left on device")

    ticks = iter(range(0, 10_000, 400))  # the clock moves 400 s a try
    with pytest.raises(OSError):  # still full when the wait is over
        checkpoints.when_space(never, tmp_path, "summary.json", sleep=lambda s: None, clock=lambda: next(ticks))
    assert next(ticks) > checkpoints.SPACE_WAIT_S  # it gave up only after the wait

    def broken():
        raise ValueError("a bug in the save")

    with pytest.raises(ValueError):
        checkpoints.when_space(broken, tmp_path, "summary.json", sleep=lambda s: pytest.fail("waited for a bug"))


def test_the_users_callback_names_a_model_whose_loss_the_trainer_would_multiply_by_the_ranks():
    """transformers' Trainer multiplies the loss by the number of ranks for a model it takes to divide by every
    rank's label count (a forward with **kwargs); DistilBERT's head ignores that count, a causal LM's uses it."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, LlamaConfig, LlamaForCausalLM

    from xeon_cluster.callbacks import loss_times_ranks

    bert = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=16, dim=8, n_layers=1, n_heads=2,
                                                                hidden_dim=16, max_position_embeddings=8))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8))
    three = NS(world_size=3, average_tokens_across_devices=True)
    why = loss_times_ranks(bert, three)
    assert why and "DistilBertForSequenceClassification" in why and "3 x the loss" in why
    assert "accepts_loss_kwargs = False" in why
    assert loss_times_ranks(llama, three) is None
    assert loss_times_ranks(bert, NS(world_size=1, average_tokens_across_devices=True)) is None
    assert loss_times_ranks(bert, NS(world_size=3, average_tokens_across_devices=False)) is None
    bert.accepts_loss_kwargs = False  # what the built-in job sets (training/modeling.py)
    assert loss_times_ranks(bert, three) is None
