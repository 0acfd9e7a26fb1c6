"""scale_frames, in every Atari file: uint8 frames become floats in [0, 1], stored channels last where a backward
pass follows (the learner) and in the default layout without gradient (the actors' small batches)."""

import pytest
import torch
from conftest import load_algo

ATARI_FILES = ["impala", "seed", "ddppo", "a3c", "apex", "r2d2"]


@pytest.mark.parametrize("name", ATARI_FILES)
def test_scale_frames_values_and_layout(name):
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    scale_frames = load_algo(name).scale_frames
    with torch.enable_grad():
        learner = scale_frames(frames)
    with torch.no_grad():
        actor = scale_frames(frames)
    torch.testing.assert_close(learner, frames.float() / 255.0, rtol=0, atol=0)
    torch.testing.assert_close(actor, frames.float() / 255.0, rtol=0, atol=0)
    assert learner.is_contiguous(memory_format=torch.channels_last)
    assert not learner.is_contiguous()
    assert actor.is_contiguous()
