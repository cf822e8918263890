"""Model FLOPs, a node's peak and MFU (cluster/cost/flops.py)."""

import pytest

from cluster.stack import catalog
from cluster.cost import flops, models

XEON_LSCPU = """Architecture:            x86_64
Vendor ID:               GenuineIntel
Model name:              Intel(R) Xeon(R) Platinum 8488C
Thread(s) per core:      2
Core(s) per socket:      48
Socket(s):               2
CPU max MHz:             3800.0000
Flags:                   fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""

# this project's 2-core test machine: no MHz lines, AMD
EPYC_LSCPU = """Vendor ID:                               AuthenticAMD
Model name:                              AMD EPYC
Core(s) per socket:                      2
Socket(s):                               1
Flags:                                   fpu avx2 avx512f avx512_bf16
"""


def test_distilbert_squad_sample_costs_about_106_gflops():
    size = models.lookup_model("distilbert-base-uncased")
    per_sample = flops.train_flops_per_sample(size.matmul_params, size.layers, size.hidden, 384)
    # 6 x 42.5M x 384 = 98.0 GFLOP of matmuls + 12 x 6 x 768 x 384^2 = 8.15 GFLOP of attention
    assert per_sample == 6 * 42_528_768 * 384 + 12 * 6 * 768 * 384 ** 2
    assert 106e9 < per_sample < 106.2e9


def test_every_catalogued_model_has_its_shape():
    for size in models.MODELS.values():
        # a causal LM's tied output layer is its embedding table and a matmul: then every parameter counts
        assert 0 < size.matmul_params <= size.params and size.hidden > 0, size.name


def test_a_lora_step_trains_the_adapters_and_runs_the_frozen_base_forward_and_backward():
    size = models.lookup_model("meta-llama/Llama-3.2-1B")
    adapters = 3_407_872  # rank 16 on q, k, v, o: 16 x (2048+2048 + 2 x (2048+512) + 2048+2048) x 16 layers
    lora = flops.train_flops_per_sample(size.matmul_params, size.layers, size.hidden, 256, adapters)
    attention = 12 * 16 * 2048 * 256 ** 2
    assert lora == 6 * adapters * 256 + 4 * (size.matmul_params - adapters) * 256 + attention
    full = flops.train_flops_per_sample(size.matmul_params, size.layers, size.hidden, 256)
    assert full == 6 * size.matmul_params * 256 + attention and 0.6 < lora / full < 0.7
    with pytest.raises(ValueError, match="trained"):
        flops.train_flops_per_sample(size.matmul_params, size.layers, size.hidden, 256, size.matmul_params + 1)


@pytest.mark.parametrize("bf16, flags, expected", [
    (True, {"amx_bf16", "avx512_bf16", "avx512f", "avx2"}, flops.AMX_BF16),
    (True, {"avx512_bf16", "avx512f", "avx2"}, flops.AVX512_BF16),
    (True, {"avx512f", "avx2"}, flops.FP32_AVX512),  # bf16 emulated: the fp32 rate
    (False, {"amx_bf16", "avx512_bf16", "avx512f", "avx2"}, flops.FP32_AVX512),
    (False, {"avx2"}, flops.FP32_AVX2),
    (False, set(), flops.FP32_SSE),
])
def test_precision_follows_dtype_and_flags(bf16, flags, expected):
    assert flops.precision(bf16, flags) == expected


def test_catalog_peak_of_r7iz_in_bf16_and_c6i_in_fp32():
    r7iz = flops.peak_from_catalog(catalog.lookup("r7iz.metal-16xl"), bf16=True)
    assert r7iz.precision == flops.AMX_BF16 and r7iz.flops_per_s == 32 * 3.9e9 * 1024
    assert "catalog: r7iz.metal-16xl" in r7iz.source
    c6i = flops.peak_from_catalog(catalog.lookup("c6i.16xlarge"), bf16=True)  # Ice Lake: no bf16 maths
    assert c6i.precision == flops.FP32_AVX512 and c6i.flops_per_s == 32 * 3.5e9 * 64
    assert flops.peak_from_catalog(catalog.custom("mine", 1, 8), bf16=False) is None  # no clock known


def test_lscpu_peak_uses_max_mhz_sockets_and_flags():
    peak = flops.peak_from_lscpu(XEON_LSCPU, bf16=True)
    assert (peak.cores, peak.ghz, peak.flops_per_cycle, peak.precision) == (96, 3.8, 1024, flops.AMX_BF16)
    assert peak.source.startswith("lscpu: Intel(R) Xeon(R) Platinum 8488C, 96 physical cores, CPU max MHz")
    assert flops.peak_from_lscpu(XEON_LSCPU, bf16=False).flops_per_cycle == 64


def test_lscpu_without_a_clock_takes_the_current_one_and_amd_halves_avx512():
    assert flops.peak_from_lscpu(EPYC_LSCPU, bf16=True) is None  # no clock anywhere: no peak, no MFU
    peak = flops.peak_from_lscpu(EPYC_LSCPU, bf16=True, current_mhz=2600)
    assert (peak.cores, peak.ghz, peak.precision, peak.flops_per_cycle) == (2, 2.6, flops.AVX512_BF16, 64)
    assert "current clock" in peak.source and "AMD" in peak.source
    named = XEON_LSCPU.replace("CPU max MHz:             3800.0000\n", "").replace("8488C", "8375C CPU @ 2.90GHz")
    assert flops.peak_from_lscpu(named, bf16=False).ghz == 2.9


def test_mfu_and_the_progress_line_round_trip():
    peak = flops.Peak(cores=2, ghz=2.5, flops_per_cycle=64, precision=flops.FP32_AVX512, source="test")
    assert peak.flops_per_s == 320e9
    assert flops.mfu(32e9, peak) == pytest.approx(0.1)
    assert flops.mfu(32e9, None) is None
    line = flops.progress_line(40, 32e9, peak)
    found = flops.last_progress(f"noise\n[r0 node1] 2026 rank 0 INFO training: {line}\nlater line\n")
    assert found["mfu"] == pytest.approx(0.1) and found["tflops_per_node"] == 0.032 and found["peak_tflops"] == 0.32
    assert found["line"].startswith("step 40: model FLOP/s per node")
    assert flops.last_progress("no such line") is None
    assert flops.progress_line(40, 32e9, None) is None


def test_model_flops_refuse_nonsense():
    with pytest.raises(ValueError, match="must be positive"):
        flops.train_flops_per_sample(0, 6, 768, 384)
