"""bench/cuda_ptx.py's pure parts: which template instance a row count compiles, and what counts as the
kernel's main loop in its PTX."""

from bench import cuda_ptx


def test_a_row_count_compiles_the_instance_the_launch_would_pick():
    assert cuda_ptx.instance(8, slices=2) == {"rows": 8, "MT": 1, "NT": 2, "REDUCE": 1, "JS": 4, "GS": 64}
    assert cuda_ptx.instance(64, slices=2)["REDUCE"] == 0
    assert cuda_ptx.instance(64, slices=1)["REDUCE"] == 1


def test_the_main_loop_is_the_instructions_around_the_tensor_core_steps():
    ptx = "\n".join(
        [".reg .b32 %r<9>;", "// comment", *["add.s32 %r1, %r1, 1;"] * 500, "mma.sync.aligned.m16n8k16 ...;", "{",
         "ld.global.v4.u32 ...;", "mma.sync.aligned.m16n8k16 ...;", "}", *["st.global.f32 ...;"] * 80]
    )  # fmt: skip
    assert cuda_ptx.main_loop_size(ptx) == 400 + 3 + 48
