"""SpotCheckpointCallback in one process: what a rebalance recommendation, an interruption notice
and a failed upload do (no process group: the all-reduce is the identity)."""

from types import SimpleNamespace as NS

from transformers import TrainerControl

from training import checkpoints
from training.callbacks import SpotCheckpointCallback


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
    callback.on_save(NS(output_dir=str(tmp_path)), NS(global_step=4, best_model_checkpoint=None), TrainerControl())
    [record] = callback.saved
    assert record["step"] == 4 and record["uri"] is None
    assert record["upload_error"] == "ConnectionError: endpoint unreachable"
    assert checkpoints.read_manifest(directory)["run_id"] == "run-a"
