"""verifier/buffers.py: views of the judge's buffers and poisoning."""


import torch


def test_prefix_view_and_poison(tmp_path):
    from musacoder.verifier import buffers

    t, ref = buffers.alloc([4, 6], torch.float32, torch.device("cpu"), tmp_path)
    v, vref = buffers.prefix_view(t, ref, [2, 5], torch.float32)
    assert vref.path == ref.path and vref.shape == [2, 5] and v.data_ptr() == t.data_ptr()
    buffers.open_ref(vref).copy_(torch.arange(10.0).view(2, 5))  # a subject writing the smaller shape
    assert torch.equal(t.view(-1)[:10], torch.arange(10.0))
    assert buffers.prefix_view(t, ref, [5, 5], torch.float32) is None  # does not fit
    assert buffers.prefix_view(t, ref, [2, 2], torch.float64) is None  # another dtype
    buffers.poison(t, 1)
    assert bool(t.isnan().all())
    n, nref = buffers.alloc([1000], torch.int64, torch.device("cpu"), tmp_path)
    buffers.poison(n, 2)
    assert int((n != 0).sum()) > 990
