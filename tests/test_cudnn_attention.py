"""recap.verify.cudnn_attention: verification passes on CUDA switch cuDNN attention off and restore the
process's own setting after the last one, whatever the threads; elsewhere nothing changes.

PyTorch's switch is a process flag that can be set without a GPU, so this runs anywhere."""

import threading

import pytest
import torch
from recap.verify.cudnn_attention import without_cudnn_attention

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def restore_flag():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.parametrize("own", [True, False])
def test_a_pass_switches_cudnn_off_and_restores_the_process_setting(own):
    torch.backends.cuda.enable_cudnn_sdp(own)
    with without_cudnn_attention(CUDA):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        with without_cudnn_attention(CUDA):
            assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert not torch.backends.cuda.cudnn_sdp_enabled()  # the outer pass still runs
    assert torch.backends.cuda.cudnn_sdp_enabled() is own


def test_off_cuda_nothing_changes():
    torch.backends.cuda.enable_cudnn_sdp(True)
    with without_cudnn_attention(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()


def test_an_error_in_the_pass_still_restores():
    torch.backends.cuda.enable_cudnn_sdp(True)
    with pytest.raises(RuntimeError), without_cudnn_attention(CUDA):
        raise RuntimeError("the forward failed")
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_overlapping_passes_on_threads_restore_only_when_the_last_leaves():
    torch.backends.cuda.enable_cudnn_sdp(True)
    inside, leave_first, seen = threading.Barrier(2), threading.Event(), {}

    def first():
        with without_cudnn_attention(CUDA):
            inside.wait()
        leave_first.set()

    def second():
        with without_cudnn_attention(CUDA):
            inside.wait()
            leave_first.wait()  # the first pass has left; this one still runs
            seen["while second runs"] = torch.backends.cuda.cudnn_sdp_enabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["while second runs"] is False
    assert torch.backends.cuda.cudnn_sdp_enabled()
