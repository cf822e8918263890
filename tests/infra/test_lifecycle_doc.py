"""docs/aws-lifecycle.md says what the program and the model do about two things a user meets without asking:
previews that show the image and the group replaced when the update replaces neither, and the cluster
placement group's later joins. Its figures and names are checked against the code they describe."""

from __future__ import annotations

from pathlib import Path

from cluster.cost import timemodel
from infra import setup_step

DOC = Path(__file__).resolve().parents[2] / "docs" / "aws-lifecycle.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    assert f"\n### {title}\n" in text, title
    return text.split(f"\n### {title}\n", 1)[1].split("\n### ", 1)[0]


def test_the_alarming_previews_are_explained_with_the_step_outputs_a_preview_cannot_know():
    said = _section("Previews that show replacements the update will not do")
    # no input of the image comes from the master: the setup step's outputs only, on what depends on them
    assert "built\napart" in said or "built apart" in said
    assert "setup step's outputs" in said and set(setup_step.OUTPUT_ONLY)
    assert "`fab preflight`" in said and "nodeSettings" in said  # what to read instead


def test_the_placement_groups_later_joins_and_the_option_that_avoids_them_are_explained():
    said = _section("The cluster placement group and the nodes that join it later")
    assert "`placementGroup: false`" in said and "`fab plan`" in said
    assert (f"{timemodel.PER_FLOW_GBPS_IN_CLUSTER_PLACEMENT_GROUP:g} Gbps inside one, "
            f"{timemodel.PER_FLOW_GBPS_OUTSIDE_PLACEMENT_GROUP:g} outside") in said
    assert "insufficient capacity" in said
