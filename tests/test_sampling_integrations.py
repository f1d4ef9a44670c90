"""torch / TensorDict / JAX conversions of sampled batches keep values and buffer sharing."""

from __future__ import annotations

import numpy as np
import pytest

from .test_sampling import make_dataset

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def lake():
    return make_dataset(None)


def test_to_torch_keeps_values_and_obs_sharing(lake):
    from episodelake.integrations.torch import to_torch

    ds, _ = lake
    stream = ds.segment_stream(5, batch_size=6, seed=0)
    batch = next(stream)
    tb = to_torch(batch)
    assert tb.obs.camera.dtype == torch.uint8 and tuple(tb.obs.camera.shape) == (6, 5, 3, 8, 8)
    assert tb.obs.camera.untyped_storage().data_ptr() == tb.next_obs.camera.untyped_storage().data_ptr()
    np.testing.assert_array_equal(tb.next_obs.state.numpy(), batch.next_obs.state)
    np.testing.assert_array_equal(tb.mask.numpy(), batch.mask)
    assert isinstance(tb.meta["task"], np.ndarray) and tb.meta["success"].dtype == torch.bool
    expected = batch.all_obs.camera.copy()
    del batch
    for _ in range(10):  # the tensor keeps its NumPy buffer out of the reuse pool
        next(stream)
    np.testing.assert_array_equal(tb.all_obs.camera.numpy(), expected)


def test_batch_to_tensordict_torchrl_layout(lake):
    pytest.importorskip("tensordict")
    from episodelake.integrations.tensordict import batch_to_tensordict

    ds, _ = lake
    batch = next(ds.segment_stream(4, batch_size=5, seed=1))
    td = batch_to_tensordict(batch)
    assert tuple(td.batch_size) == (5,)
    np.testing.assert_array_equal(td["observation", "camera"].numpy(), batch.obs.camera)
    np.testing.assert_array_equal(td["next", "observation", "state"].numpy(), batch.next_obs.state)
    np.testing.assert_array_equal(td["next", "reward"].numpy(), batch.reward)
    np.testing.assert_array_equal(td["next", "done"].numpy(), batch.terminated | batch.truncated)
    np.testing.assert_array_equal(td["meta", "success"].numpy(), batch.meta["success"])
    obs, nxt = td["observation", "state"], td["next", "observation", "state"]
    assert obs.untyped_storage().data_ptr() == nxt.untyped_storage().data_ptr()
    tr = ds.sample_transitions(7, n_step=2, seed=0)
    ttd = batch_to_tensordict(tr)
    np.testing.assert_allclose(ttd["discount"].numpy(), tr.discount)
    np.testing.assert_array_equal(ttd["next", "observation", "camera"].numpy(), tr.next_obs.camera)


def test_to_jax_copies_values(lake):
    pytest.importorskip("jax")
    from episodelake.integrations.jax import to_jax

    ds, _ = lake
    stream = ds.segment_stream(4, batch_size=3, seed=2)
    batch = next(stream)
    jb = to_jax(batch)
    expected = batch.obs.camera.copy()
    np.testing.assert_array_equal(np.asarray(jb.obs.camera), expected)
    del batch
    for _ in range(10):
        next(stream)
    np.testing.assert_array_equal(np.asarray(jb.obs.camera), expected)
