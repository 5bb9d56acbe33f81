"""verifier/capture.py: each call's intermediates kept alive through a capture, and the bytes they hold."""

import contextlib

import pytest
import torch

from musacoder.verifier.capture import KeepAlive


def _three_ops(x):
    return (x * 2 + 1).relu()


def test_every_calls_intermediates_are_held_at_addresses_of_their_own():
    sets = [torch.rand(1024) for _ in range(4)]
    with KeepAlive() as keep:
        outs = [_three_ops(x) for x in sets]
    # two intermediates a call (the product and the sum), each 4 KiB, none shared between calls
    assert keep.held_bytes(leave_out=(sets, outs)) == 4 * 2 * 4096
    held = {t.untyped_storage().data_ptr() for t in keep.held} - {t.data_ptr() for t in outs}
    assert len(held) == 8
    keep.release()
    assert keep.held == []


def test_an_in_place_result_or_a_view_is_counted_once():
    x = torch.rand(1024)
    with KeepAlive() as keep:
        y = x.mul(2).add_(1).view(32, 32).relu()
    assert keep.held_bytes(leave_out=(x, y)) == 4096


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_in_a_cuda_graph_no_call_reuses_another_calls_intermediates():
    """Without the keep-alive, a capture hands call 1 the addresses call 0 freed; with it, none is reused."""
    sets = [torch.rand(1 << 16, device="cuda") for _ in range(8)]
    _three_ops(sets[0])
    torch.cuda.synchronize()

    def addresses(keep_alive: bool) -> int:
        seen, graph, keep = [], torch.cuda.CUDAGraph(), KeepAlive()
        with torch.cuda.graph(graph), keep if keep_alive else contextlib.nullcontext():
            for x in sets:
                t = x * 2
                seen.append(t.data_ptr())
                _ = (t + 1).relu()
        keep.release()
        return len(set(seen))

    assert addresses(True) == len(sets)
    assert addresses(False) < len(sets)
