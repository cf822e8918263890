"""CPU features, cores, allocator detection from /proc text."""

from training import hardware

SPR_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Gold 6455B
physical id\t: 0
core id\t: 0
flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
physical id\t: 0
core id\t: 0
flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 2
physical id\t: 1
core id\t: 0
flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 3
physical id\t: 1
core id\t: 1
flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ICELAKE_FLAGS = "flags\t\t: fpu avx2 avx512f avx512_vnni\n"


def test_bf16_needs_amx_or_avx512_bf16():
    assert hardware.bf16_support(hardware.cpu_flags(SPR_CPUINFO)) == (True, "CPU has AMX-BF16")
    assert hardware.bf16_support(frozenset({"avx512_bf16"})) == (True, "CPU has AVX512-BF16")
    supported, reason = hardware.bf16_support(hardware.cpu_flags(ICELAKE_FLAGS))
    assert not supported and "neither" in reason


def test_ipex_bf16_needs_avx512_bw_vl_dq_or_avx_ne_convert():
    assert hardware.ipex_bf16_support(frozenset({"avx2", "avx512bw", "avx512vl", "avx512dq"}))
    assert hardware.ipex_bf16_support(frozenset({"avx2", "avx_ne_convert"}))
    assert not hardware.ipex_bf16_support(frozenset({"avx2", "avx512bw", "avx512vl"}))  # no DQ
    assert not hardware.ipex_bf16_support(frozenset({"avx2", "fma"}))


def test_physical_cores_count_distinct_socket_core_pairs():
    assert hardware.physical_cores(SPR_CPUINFO) == 3  # hyperthread sibling of core 0 not counted
    assert hardware.cpu_model(SPR_CPUINFO) == "Intel(R) Xeon(R) Gold 6455B"


def test_allocator_is_what_is_mapped_not_what_was_asked():
    maps = ("7f00-7f01 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libtcmalloc.so.4.5.9\n"
            "7f02-7f03 r-xp 00000000 08:01 124 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0\n"
            "7f04-7f05 rw-p 00000000 00:00 0 [heap]\n")
    libraries = hardware.loaded_libraries(maps)
    assert hardware.allocator(libraries) == "tcmalloc"
    assert hardware.openmp_runtime(libraries) == "GNU OpenMP (libgomp)"
    assert hardware.allocator(frozenset({"libc.so.6"})) == "glibc malloc"


def test_this_process_reports_something_real():
    assert hardware.physical_cores() >= 1
    assert "libc.so.6" in hardware.loaded_libraries() or hardware.loaded_libraries()
