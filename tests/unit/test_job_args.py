"""fab train's and fab k8s-job's options checked before they become the job's arguments."""

import re

import pytest

from cluster.job.job_args import JobArgsError, parse_s3_uri, training_arguments


@pytest.mark.parametrize("epochs, checkpoint_minutes", [("2", "5"), ("0.5", "0"), (3, 2.5), ("", ""), (None, None)])
def test_usable_epochs_and_checkpoint_minutes_pass_as_given(epochs, checkpoint_minutes):
    args = training_arguments(epochs=epochs, checkpoint_minutes=checkpoint_minutes)
    expected = ([] if epochs in (None, "") else ["--num_train_epochs", str(epochs)]) + (
        [] if checkpoint_minutes in (None, "") else ["--checkpoint_minutes", str(checkpoint_minutes)])
    assert args == expected


@pytest.mark.parametrize("value", ["two", "0", "-1", "nan", "inf", "1e400", float("nan")])
def test_epochs_must_be_a_finite_number_above_0(value):
    with pytest.raises(JobArgsError, match=rf"^--epochs: {re.escape(repr(value))} is not allowed; give a number above "
                                           rf"0"):
        training_arguments(epochs=value)


@pytest.mark.parametrize("value", ["nan", "often", "-5", "inf", "-inf", float("inf")])
def test_checkpoint_minutes_must_be_a_finite_number_of_0_or_more(value):
    with pytest.raises(JobArgsError, match=rf"^--checkpoint-minutes: {re.escape(repr(value))} is not allowed; give 0 "
                                           rf"\(off\)"):
        training_arguments(checkpoint_minutes=value)


@pytest.mark.parametrize("uri", ["s3://my-bucket\n/runs", "s3://my-bucket\n", "s3://abc\n/x"])
def test_a_bucket_name_with_a_trailing_newline_is_refused(uri):
    with pytest.raises(JobArgsError, match="--checkpoint-uri: .* is not allowed; allowed: s3://BUCKET/PREFIX"):
        training_arguments(checkpoint_uri=uri)
    with pytest.raises(JobArgsError):
        parse_s3_uri(uri)
    assert parse_s3_uri("s3://my-bucket/runs/") == ("my-bucket", "runs")
