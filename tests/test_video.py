"""--capture-video in every file: evaluation episode 0 is written as an MP4 (envpool's render, encoded by
imageio-ffmpeg) that decodes back to one frame per step of that episode, at the size envpool renders."""

import imageio
import pytest
from conftest import check_ok
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# a few seconds of training per file: the video is of whatever policy that leaves
TINY = {
    "a3c": ["--total-timesteps", 4000, "--num-workers", 1],
    "apex": ["--total-timesteps", 6144, "--learning-starts", 1024, "--num-actors", 1],
    "ddppo": ["--total-timesteps", 4096, "--local-num-envs", 8],
    "es": ["--total-timesteps", 2000],
    "fedpg": ["--total-timesteps", 3000, "--num-clients", 2],
    "ga": ["--total-timesteps", 2000],
    "impala": ["--total-timesteps", 3200, "--num-actors", 1],
    "r2d2": ["--total-timesteps", 6144, "--learning-starts", 1024, "--num-actors", 1],
    "seed": ["--total-timesteps", 3200, "--num-actors", 1],
}


def decoded_frame_shapes(run_dir) -> list:
    with imageio.get_reader(run_dir / "videos" / "eval_episode0.mp4") as reader:
        return [frame.shape for frame in reader]


@pytest.mark.parametrize("name", sorted(TINY))
def test_video_of_the_first_eval_episode_decodes_frame_by_frame(runner, name):
    check_ok(runner.run(name, *TINY[name], "--eval-episodes", 3, "--capture-video"))
    run_dir = runner.run_dir("CartPole-v1", name)
    events = EventAccumulator(str(run_dir))
    events.Reload()
    first_return = events.Scalars("eval/episodic_return")[0].value
    shapes = decoded_frame_shapes(run_dir)
    # CartPole pays 1 per step, so episode 0's return is its length: one frame per step, none after the end
    assert len(shapes) == first_return
    assert set(shapes) == {(400, 600, 3)}


def test_video_of_an_atari_episode_has_the_screens_size(runner):
    check_ok(
        runner.run("ddppo", "--env-id", "Pong-v5", "--total-timesteps", 1024, "--eval-episodes", 1, "--capture-video")
    )
    shapes = decoded_frame_shapes(runner.run_dir("Pong-v5", "ddppo"))
    # a Pong game lasts until one side has 21 points: hundreds of agent steps at the least
    assert len(shapes) > 100
    assert set(shapes) == {(210, 160, 3)}
