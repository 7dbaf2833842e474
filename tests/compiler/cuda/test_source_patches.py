"""The CUDA source patches: each one's behaviour on crafted source, and a guard on TVM's real output
that fails once TVM stops emitting the pattern the patch repairs (then the patch goes)."""

from __future__ import annotations

import re

import pytest

from inferx_edge.compiler.cuda import fix_int8_vector_constants
from tests.helpers import int8_matmul_module, kernel_source, main_loop, needs_nvrtc, nhwc_int8_conv


def test_constant_int8_vectors_are_packed_into_ints():
    from inferx_edge.compiler.cuda import fix_int8_vector_constants

    zeros = "make_int4(" + ", ".join(["(signed char)0"] * 16) + ")"
    assert fix_int8_vector_constants(f"v = {zeros};") == "v = make_int4(0, 0, 0, 0);"
    mixed = "make_int2(" + ", ".join(["(signed char)-1"] * 7 + ["(signed char)3"]) + ")"
    assert fix_int8_vector_constants(mixed) == "make_int2(-1, 67108863)"  # bytes ff ff ff 03, little-endian
    assert fix_int8_vector_constants("make_int4(a, b, c, d)") == "make_int4(a, b, c, d)"


@needs_nvrtc
def test_guard_tvm_still_prints_16_char_int8_constants():
    """Guard of ``fix_int8_vector_constants``: a padded conv with 16-byte predicated activation loads
    makes TVM print its zero as ``make_int4`` of 16 chars. When this fails, TVM prints them correctly:
    delete the patch (and this guard)."""
    source = kernel_source("h200", nhwc_int8_conv(8, 16, 256, 256, 3), "2x4.2x4.k8.v16.p16.a8.w16.async3.mma")
    assert re.search(r"make_int4\(\s*\(\(?signed char\)", source)
    assert not re.search(r"make_int4\(\s*\(\(?signed char\)", fix_int8_vector_constants(source))


@needs_nvrtc
def test_int8_accumulators_leave_registers_without_warp_shuffles():
    """TVM reads the accumulators it stores to shared memory through a __shfl_sync of the thread's
    own lane (one per value); the CUDA source the device compiler gets has none left."""
    from inferx_edge.compiler.cuda import drop_own_lane_shuffles

    source = kernel_source("h200", int8_matmul_module(256), "2x4.2x4.k4.v16.a8.w16.async.mma")
    own = "__shfl_sync(__activemask(), matmul_intermediate_reindex_shared_dyn_warp_ptr["
    assert "mma.sync.aligned.m16n8k32" in source and own in source
    assert "__shfl_sync(__activemask()" not in drop_own_lane_shuffles(source)


def test_own_lane_shuffles_are_dropped_and_others_kept():
    from inferx_edge.compiler.cuda import drop_own_lane_shuffles as drop

    assert drop("x = __shfl_sync(__activemask(), a[f(b, c)], ((int)threadIdx.x), 32);") == "x = (a[f(b, c)]);"
    kept = (
        "x = __shfl_sync(__activemask(), a[i], (((int)threadIdx.x) + 1), 32);",  # another lane
        "x = __shfl_sync(__activemask(), a[i], ((int)threadIdx.x), 16);",  # half-warp groups
        "x = __shfl_sync(mask, a[i], ((int)threadIdx.x), 32);",
        "#define __shfl_sync(mask, var, lane, width) __shfl((var), (lane), (width))",
    )
    for code in kept:
        assert drop(code) == code
    two = "y = __shfl_sync(__activemask(), p[0], ((int)threadIdx.x), 32) + __shfl_sync(__activemask(), q, ((int)threadIdx.x), 32);"
    assert drop(two) == "y = (p[0]) + (q);"


def test_compiler_errors_keep_the_errors_not_the_warnings():
    from inferx_edge.compiler.cuda import compiler_errors

    log = "\n".join(
        [
            f'k.cu({i}): warning #177-D: variable "v{i}" was declared but never referenced\n  int v;\n  ^'
            for i in range(400)
        ]
        + ["k.cu(900): error: too many arguments in function call", "  make_int4(0, 0, 0, 0, 0)", "  ^"]
        + ['1 error detected in the compilation of "k.cu".']
    )
    text = compiler_errors(log)
    assert text.startswith("k.cu(900): error: too many arguments") and "make_int4" in text and "warning" not in text
    assert compiler_errors("ptxas fatal: something") == "ptxas fatal: something"


@needs_nvrtc
@pytest.mark.parametrize(
    "tile,lead",
    [
        ("2x4.4x4.k8.v16.a8.w16.async3.mma", 2),  # the 8-warp 128x256 tile
        ("2x4.4x4.k8.v16.a8.w16.r2.async3.mma", 2),  # with fragment double buffering
        ("2x4.2x4.k8.v16.async4.mma", 3),  # four buffers
    ],
)
def test_pipelined_copies_are_spread_over_the_math_steps(tile, lead):
    """TVM's pipelined loop (barrier, all copies of stage k+L, commit, wait(L), barrier, math) becomes
    CUTLASS's: wait(L-1), one barrier, the math with each 32-deep step issuing its share of the
    copies, commit; the build's CUDA record counts the loops it rewrote."""
    from inferx_edge.compiler.cuda import interleave_pipelined_copies

    source = kernel_source("h200", int8_matmul_module(256, 512, 2048), tile)
    kernel = next(k for k in source.split("__global__") if "mma.sync" in k)
    before = main_loop(kernel)
    assert before.count("__syncthreads();") == 2 and f"wait_group_{lead}();" in before
    new, changed = interleave_pipelined_copies(source)
    assert changed == 1 and interleave_pipelined_copies(new)[1] == 0  # rewritten loops do not match again
    after = main_loop(next(k for k in new.split("__global__") if "mma.sync" in k))
    assert after.count("__syncthreads();") == 1 and f"wait_group_{lead - 1}();" in after
    head, _, math = after.partition("__syncthreads();")
    assert "ptx_cp_async_legacy" not in head and math.rstrip().endswith("commit_group();")
    # every copy now sits inside the loop over 32-deep steps, split by that loop's variable
    steps = re.search(r"for \(int (\w+) = 0; \1 < (\d+); \+\+\1\) \{", math)
    spread = re.findall(rf"for \(int (\w+) = {steps.group(1)} \* (\d+); ", math)
    assert len(spread) == 2 and math.index("ptx_cp_async_legacy") > steps.start()
    copies = dict(re.findall(r"for \(int (\w+) = 0; \1 < (\d+); \+\+\1\) \{\s*ptx_cp_async_legacy", before))
    assert all(int(per) * int(steps.group(2)) >= int(copies[v]) for v, per in spread)  # every copy, once


@needs_nvrtc
def test_padded_convolutions_keep_their_synchronous_loads_ahead_of_the_math():
    """A padded convolution loads its activations synchronously (predicated, zero outside the image):
    those loads stay in one burst right after the barrier; the weights' cp.async copies are spread."""
    from inferx_edge.compiler.cuda import interleave_pipelined_copies

    source = kernel_source("h200", nhwc_int8_conv(8, 16, 256, 256, 3), "2x4.2x4.k8.v16.p16.a8.w16.async3.mma")
    new, changed = interleave_pipelined_copies(source)
    assert changed == 1
    after = main_loop(next(k for k in new.split("__global__") if "mma.sync" in k))
    steps = re.search(
        r"for \(int (\w+) = 0; \1 < \d+; \+\+\1\) \{", after.split("__syncthreads();")[1].split("condval")[-1]
    )
    first_step = after.index(steps.group(0))
    assert after.count("__syncthreads();") == 1 and after.index("condval") < first_step < after.index(
        "ptx_cp_async_legacy"
    )


def test_interleaving_leaves_other_loops_alone():
    """Loops without TVM's pipeline shape are not touched: no cp.async group, a second barrier among
    the copies, a stage of one step (nothing to spread over), two buffers (one stage in flight)."""
    from inferx_edge.compiler.cuda.c_scanner import _statements
    from inferx_edge.compiler.cuda.source_patches import interleave_pipelined_copies

    plain = "__global__ void k(int* a) {\n  for (int i = 0; i < 4; ++i) {\n    a[i] = 1;\n  }\n}\n"
    assert interleave_pipelined_copies(plain) == (plain, 0)
    loop = (
        "  for (int k0 = 0; k0 < 6; ++k0) {\n    __syncthreads();\n"
        "    for (int c = 0; c < 4; ++c) {\n      ptx_cp_async_legacy_cg_16_1_1(s, c, g, k0);\n    }\n"
        "    tvm_builtin_ptx_cp_async_commit_group_async_commit_group();\n"
        "    tvm_builtin_ptx_cp_async_wait_group_async_wait_group_2();\n    __syncthreads();\n"
        "    for (int k1 = 0; k1 < STEPS; ++k1) {\n      mma(k1);\n    }\n  }\n"
    )
    new, changed = interleave_pipelined_copies(loop.replace("STEPS", "2"))
    assert changed == 1 and "for (int c = k1 * 2; c < k1 * 2 + 2; ++c)" in new and new.count("__syncthreads") == 1
    assert "wait_group_1();" in new and new.rstrip().endswith("}")
    two_buffers = loop.replace("STEPS", "2").replace("wait_group_2", "wait_group_1")
    assert interleave_pipelined_copies(two_buffers)[1] == 0  # one stage in flight: left as TVM emits it
    assert interleave_pipelined_copies(loop.replace("STEPS", "1"))[1] == 0  # one step per stage
    barrier_inside = loop.replace("      ptx_cp_async", "      __syncthreads();\n      ptx_cp_async")
    assert interleave_pipelined_copies(barrier_inside.replace("STEPS", "2"))[1] == 0
    three = loop.replace("STEPS", "3").replace("c < 4", "c < 8")
    assert "c < min(k1 * 3 + 3, 8)" in interleave_pipelined_copies(three)[0]  # uneven shares
    # statements: braces inside asm strings and char literals, if/else chains, braceless bodies
    body = 'asm("{%0}" : "=r"(x));\nif (a) { b(); } else if (c) { d(); } else { e(); }\nchar q = \'{\';\nfor (;;) f();\n{ g(); }'
    assert _statements(body) == [
        'asm("{%0}" : "=r"(x));',
        "if (a) { b(); } else if (c) { d(); } else { e(); }",
        "char q = '{';",
        "for (;;) f();",
        "{ g(); }",
    ]


_GATHER8 = "make_uint4(" + ", ".join(f"x[((int2*)(&(i.{c})))->{h}]" for c in "xyzw" for h in "xy") + ")"
_KERNEL8 = (
    "#include <cuda_fp16.h>\n"
    'extern "C" __global__ void k(half* __restrict__ x, half* __restrict__ y, int4 i) {\n'
    f"  *(uint4*)(y + 0) = {_GATHER8};\n"
    "  *(uint4*)(y + 8) = make_uint4(1u, 2u, 3u, 4u);\n"
    "}\n"
)


def test_gathered_half8_packs_become_a_helper_and_others_stay():
    from inferx_edge.compiler.cuda import source_patches

    patched = source_patches.fix_gathered_half8_packs(_KERNEL8)
    assert "__inferx_pack8(x[((int2*)(&(i.x)))->x]" in patched
    assert "make_uint4(1u, 2u, 3u, 4u)" in patched  # 4 words: already valid, untouched
    assert patched.index("uint4 __inferx_pack8") > patched.index("#include <cuda_fp16.h>")
    assert source_patches.fix_gathered_half8_packs("make_uint4(a, b, c, d)") == "make_uint4(a, b, c, d)"


@needs_nvrtc
def test_gathered_half8_packs_compile_after_the_patch():
    """TVM 0.27 prints an 8-lane fp16 gather as ``make_uint4`` of eight halves (EfficientNet fp16 for
    sm_87/sm_90 failed with "too many arguments in function call"); patched, it compiles."""
    from inferx_edge.compiler.cuda import source_patches
    from inferx_edge.compiler.cuda.toolkit import find_nvrtc, nvrtc_compile

    nvrtc = find_nvrtc(None)
    with pytest.raises(Exception, match="too many arguments"):
        nvrtc_compile(nvrtc, _KERNEL8, "sm_90", "cubin")
    assert nvrtc_compile(nvrtc, source_patches.fix_gathered_half8_packs(_KERNEL8), "sm_90", "cubin")


@needs_nvrtc
def test_dumped_sources_keep_one_file_per_compilation(tmp_path):
    """INFERX_DUMP_CUDA numbered its files per compiler context, so a build's per-kernel retries all
    wrote kernels_<pid>_1.cu over each other; each compilation keeps its own file now, and the source
    as compiled (after the repairs) where it differs."""
    from inferx_edge.compiler.cuda import CudaOptions
    from tests.helpers import nhwc_fp16_small_reduction

    dump = tmp_path / "dump"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERX_DUMP_CUDA", str(dump))
        assert CudaOptions.from_env().dump_dir == dump
        kernel_source("h200", nhwc_fp16_small_reduction("pool"))
        kernel_source("h200", nhwc_fp16_small_reduction("depthwise"))
    generated = sorted(p.name for p in dump.glob("*.cu") if not p.name.endswith(".compiled.cu"))
    assert len(generated) == 2
    sources = [(dump / name).read_text() for name in generated]
    assert sum("max_pool2d" in src for src in sources) == 1 and sum("conv2d" in src for src in sources) == 1
