"""The direct runner's descriptor expansion (`kernels.launch.descriptor_expander`): each TMA
descriptor argument becomes Triton's expansion of it, made again only when its base address moves.
(The C launcher it feeds runs on the GPU: `test_program.test_gpu_replays_call_the_c_launcher_on_triton_3_6`.)"""

from __future__ import annotations

from mxattention.kernels.launch import descriptor_expander


class _Base:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class _Desc:
    def __init__(self, ptr: int) -> None:
        self.base = _Base(ptr)


def _expander():
    made = []

    def expand(desc, meta):
        made.append((desc.base.data_ptr(), meta))
        return [f"map@{desc.base.data_ptr()}/{meta}", 64, 128, 128, 1]

    # positions 1 and 3 hold descriptors, listed last first as `launch._c_launcher` lists them
    return descriptor_expander(((3, "v", expand), (1, "k", expand))), made


def test_descriptors_are_expanded_in_place():
    flatten, made = _expander()
    got = flatten((7, _Desc(4096), 8, _Desc(8192), 9))
    assert got == [7, "map@4096/k", 64, 128, 128, 1, 8, "map@8192/v", 64, 128, 128, 1, 9]
    assert sorted(made) == [(4096, "k"), (8192, "v")]


def test_an_expansion_is_remade_only_when_its_address_moves():
    flatten, made = _expander()
    flatten((0, _Desc(4096), 0, _Desc(8192)))
    flatten((1, _Desc(4096), 1, _Desc(8192)))  # the same buffers again: nothing expanded
    assert len(made) == 2
    got = flatten((2, _Desc(4096), 2, _Desc(12288)))  # V's buffer moved
    assert made[2:] == [(12288, "v")]
    assert got[:6] == [2, "map@4096/k", 64, 128, 128, 1] and got[7] == "map@12288/v"
    got = flatten((3, _Desc(12288), 3, _Desc(4096)))  # the addresses swap: both remade, each its own
    assert got[1] == "map@12288/k" and got[7] == "map@4096/v"


def test_no_descriptor_passes_the_arguments_through():
    args = (1, 2, 3)
    assert descriptor_expander(())(args) is args
