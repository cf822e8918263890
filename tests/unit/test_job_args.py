"""fab train's and fab k8s-job's settings checked in the request, and passed to the job as given."""

import math
import re

import pytest

from cluster.job.job_args import JobArgsError, parse_s3_uri
from cluster.job.request import BuiltinJob, RequestError, RunRequest
from tests.unit.test_jobplan import inventory, job_plan

RUN = "20260101-000000-aaaa"


@pytest.mark.parametrize("epochs, every_s, words", [(2.0, 300.0, ["2", "5"]), (0.5, 0.0, ["0.5", "0"]),
                                                     (3, 150.0, ["3", "2.5"]), (None, None, [])])
def test_usable_epochs_and_checkpoint_minutes_pass_as_given(epochs, every_s, words):
    run = RunRequest(RUN, 2, BuiltinJob(epochs=epochs), checkpoint_every_s=every_s)
    from cluster.job.jobplan import plan

    args = list(plan(run, inventory()).training_args)
    found = [args[args.index(flag) + 1] for flag in ("--num_train_epochs", "--checkpoint_minutes") if flag in args]
    assert found == words


@pytest.mark.parametrize("value", ["two", 0, -1, math.nan, math.inf, float("1e400")])
def test_epochs_must_be_a_finite_number_above_0(value):
    with pytest.raises(RequestError, match=rf"^--epochs: {re.escape(repr(value))} is not allowed; allowed: a number "
                                           rf"above 0"):
        BuiltinJob(epochs=value)


@pytest.mark.parametrize("value", [math.nan, "often", -5, math.inf, -math.inf])
def test_checkpoint_minutes_must_be_a_finite_number_of_0_or_more(value):
    with pytest.raises(RequestError, match=rf"^--checkpoint-every: {re.escape(repr(value))} is not allowed; allowed: "
                                           rf"a number from 0"):
        RunRequest(RUN, 2, BuiltinJob(), checkpoint_every_s=value)


@pytest.mark.parametrize("uri", ["s3://my-bucket\n/runs", "s3://my-bucket\n", "s3://abc\n/x"])
def test_a_bucket_name_with_a_trailing_newline_is_refused(uri):
    with pytest.raises(RequestError, match="--checkpoint-uri: .* is not allowed; allowed: s3://BUCKET/PREFIX"):
        RunRequest(RUN, 2, BuiltinJob(), checkpoint_uri=uri)
    with pytest.raises(JobArgsError):
        parse_s3_uri(uri)
    assert parse_s3_uri("s3://my-bucket/runs/") == ("my-bucket", "runs")
    assert "--checkpoint_uri" not in job_plan(inventory(), 2).training_args
