"""`fab plan`'s predicted MFU per node count (pure): the model FLOPs of the planned model at the data
set's length (cluster/cost/flops.py) over each row's epoch, against the instance type's peak in the
precision the job will use (bf16 where the CPU has it, as the job chooses)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from cluster.cost import flops, models, plan_options
from cluster.cost.calibration import Calibration
from cluster.cost.costplan import PlanRow
from cluster.cost.plan_options import PlanInputs, PlanOptions, Sources


@dataclass(frozen=True)
class PlanFlops:
    per_sample: float  # model FLOPs of one training sample; 0: not known
    peak: flops.Peak | None
    sources: Sources

    def mfu(self, inputs: PlanInputs, row: PlanRow) -> float | None:
        """The row's MFU: model FLOP/s per node over an epoch, over one node's peak."""
        seconds = row.prediction.epoch_seconds
        if not self.per_sample or seconds <= 0:
            return None
        return flops.mfu(self.per_sample * inputs.workload.samples / row.nodes / seconds, self.peak)

    def line(self, inputs: PlanInputs, rows: list[PlanRow]) -> str:
        shown = [(row.nodes, self.mfu(inputs, row)) for row in rows]
        if self.peak is None or any(m is None for _, m in shown):
            return "MFU: not predicted (" + "; ".join(f"{n}: {v} [{s}]" for n, v, s in self.sources) + ")"
        return (f"MFU (model FLOP/s per node over the peak, {self.peak.describe()}): "
                + ", ".join(f"{n} node(s) {m:.1%}" for n, m in shown))

    def render_sources(self) -> str:
        return "\n".join(f"  {name}  {value}  [{source}]" for name, value, source in self.sources)

    def json(self, inputs: PlanInputs, rows: list[PlanRow]) -> str:
        """costplan's JSON rows, each with its `mfu` (None: not known)."""
        def rounded(value):
            return None if value is None else round(value, 5)

        return json.dumps([{**row.as_json(), "mfu": rounded(self.mfu(inputs, row))} for row in rows], indent=2)


def plan_flops(options: PlanOptions, inputs: PlanInputs, cal: Calibration | None = None) -> PlanFlops:
    """The model FLOPs and peak of the plan `inputs` came from (the same model and data set choice)."""
    peak = flops.peak_from_catalog(inputs.instance, bf16=inputs.instance.bf16)
    sources: Sources = [("peak", peak.describe() if peak else "not known",
                         "the catalog's cores and clock" if peak else f"the catalog has no clock for "
                                                                      f"{inputs.instance.name}")]
    try:
        (model_name, n_params), (data_name, _), _ = plan_options.sizes(options, cal)
        trained, _ = plan_options.trained_params(options, model_name, n_params)
        size = models.lookup_model(model_name)
        seq = (cal.seq_len if cal and cal.model == model_name and cal.seq_len
               else models.lookup_dataset(data_name).seq_len)
    except (LookupError, ValueError):
        return PlanFlops(0.0, peak, sources + [("model FLOPs", "not known", "the model is not in the model catalog")])
    if not size.matmul_params:
        return PlanFlops(0.0, peak, sources + [("model FLOPs", "not known", f"no shape for {size.name}")])
    trained = min(trained, size.matmul_params)
    per_sample = flops.train_flops_per_sample(size.matmul_params, size.layers, size.hidden, seq, trained)
    frozen = size.matmul_params - trained
    terms = (f"6 x {trained / 1e6:.1f}M trained + 4 x {frozen / 1e6:.1f}M frozen matmul params" if frozen
             else f"6 x {size.matmul_params / 1e6:.1f}M matmul params")
    return PlanFlops(per_sample, peak, sources + [(
        "model FLOPs", f"{per_sample / 1e9:.1f} GFLOP per sample",
        f"{terms} x {seq} tokens + attention, {size.layers} layers of {size.hidden} (cluster/cost/flops.py)")])
