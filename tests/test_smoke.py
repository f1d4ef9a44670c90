import numpy as np

from .reference import expected_segment


def test_episode_reads_match_reference(robot_dataset, raw_episodes):
    assert len(robot_dataset) == len(raw_episodes)
    assert robot_dataset.num_steps == sum(e.length for e in raw_episodes)
    for i, raw in enumerate(raw_episodes):
        seg = robot_dataset.episode(i).read()
        want = expected_segment(raw, 0, raw.length)
        np.testing.assert_array_equal(seg.obs.state, want["obs/state"])
        np.testing.assert_array_equal(seg.next_obs.camera, want["next_obs/camera"])
        np.testing.assert_array_equal(seg.action, want["action/action"])
        np.testing.assert_array_equal(seg.reward, want["reward"])
        np.testing.assert_array_equal(seg.terminated, want["terminated"])
        np.testing.assert_array_equal(seg.truncated, want["truncated"])
        assert seg.meta["task"] == raw.meta["task"]
        assert np.shares_memory(seg.all_obs.state, seg.obs.state)
        assert np.shares_memory(seg.all_obs.state, seg.next_obs.state)
