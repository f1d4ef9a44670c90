"""Replay-buffer benchmarks: episodelake vs in-memory replay buffers, same data, same run, ratios.

Part 1, the online loop in one process: store step by step into a full
buffer (capacity 100k steps, FIFO eviction on; episodes of 100 steps;
observation float32[8], action float32[2], reward float32) while sampling
256 transitions every 4 steps:

* episodelake, one ``Dataset``: the form users write first,
  ``ds = el.Dataset.create(schema, capacity=100_000)`` (in memory), its
  ``new_episode``/``add_step`` per step and
  ``ds.segment_stream(el.Window(1), batch_size=256, follow=True)`` on the
  same object, default options (the stream samples the episodes finished
  since from the writer's memory; they are committed every 64 episodes,
  each commit evicting the oldest);
* episodelake, two handles: an ``EpisodeWriter`` of a capacity dataset on
  disk (committing every 64 episodes, each commit evicting the oldest) and a
  learner stream ``segment_stream(el.Window(1), batch_size=256, follow=True,
  prefetch=0)`` on a second ``Dataset`` object of the same path (it takes in
  each commit);
* cpprb ``ReplayBuffer`` (in memory, a 100k ring): ``add`` per step,
  ``sample(256)`` every 4 steps;
* memmap-replay-buffer ``circular=True`` (its default msync per step), its
  dataloader over 2-step windows (first round only: it runs ~50 steps/s).

The systems alternate over ``--online-rounds`` rounds; each row prints the
median rate and the median of its per-round ratios to cpprb.

Part 3, learner refresh latency: a writer commits one episode (``flush``);
the time until the learner's stream has it (``stream.refresh()``), median
over rounds, at 1k, 10k and 100k committed episodes (``--quick``: 1k, 10k),
built by a bulk import of 10-step episodes.

Part 2, prioritized replay: ``sample(256)`` + ``update_priorities`` on 1M
transitions (1,000 episodes x 1,000 steps; observation float32[8], action
float32[2], reward float32; ``--quick``: 100k). Every system holds the same
transitions and gets the same new priorities (``|N(0, 1)| + 1e-3``), with
``alpha = 0.6``, ``beta = 0.4``:

* episodelake, transitions: ``ds.sample_transitions(256, sampler=per)`` and
  ``per.update_priorities(tr.indices, ...)`` with a kept
  ``el.PrioritizedSampler`` (a local dataset on disk, opened fresh);
* episodelake, stream: ``ds.segment_stream(1, batch_size=256,
  sampler=el.Prioritized(1.0))``, ``stream.sample()`` and
  ``stream.update_priorities(batch.indices, ...)``;
* cpprb ``PrioritizedReplayBuffer`` (C++ segment trees, data in memory):
  ``sample(256, beta=0.4)`` (obs, act, rew, next_obs, done, weights,
  indexes) and ``update_priorities(indexes, ...)``;
* the copy limit: ``B`` uniform transitions gathered by NumPy from arrays in
  memory (the copy alone: no priorities, no sum tree), printed beside each row;
* TorchRL ``PrioritizedReplayBuffer``, where its C++ sum tree loads (it does
  not beside our torch 2.13.0 wheel: the benchmark says so).

Rounds alternate between the systems (one process, so background load hits
all alike); each prints its median rate over the rounds and the ratio to
cpprb. ``torch.set_num_threads(1)``.

Run: ``.venv/bin/python benchmarks/bench_replay.py [--quick] [--rounds R] [--dir DIR] [--parts 1,2,3]``
(part 1's sizes: ``--online-steps``, ``--single-steps``, ``--memmap-steps``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import episodelake as el
from episodelake.sampling.stream import SegmentStream

B = 256
LIMIT = "copy limit: NumPy gather of B transitions from memory"
ALPHA, BETA = 0.6, 0.4
STEPS = 1000  # per episode


def make_lake(path: Path, episodes: int) -> None:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (8,), "float32"),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.create(schema, str(path))
    ds.append_episodes(
        {
            "observations": data["obs"],
            "actions": data["act"],
            "rewards": data["rew"],
            "terminated": True,
        }
        for data in (episode(i) for i in range(episodes))
    )
    ds.close()


def episode(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([1, i])
    return {
        "obs": rng.standard_normal((STEPS + 1, 8), dtype=np.float32),
        "act": rng.standard_normal((STEPS, 2), dtype=np.float32),
        "rew": rng.standard_normal(STEPS, dtype=np.float32),
    }


def lake_transitions(path: Path) -> Callable[[np.ndarray], None]:
    ds = el.Dataset.open(str(path))
    assert ds.num_steps == len(ds) * STEPS, "the benchmark dataset is incomplete"
    per = el.PrioritizedSampler(alpha=ALPHA, beta=BETA, seed=0)

    def step(new: np.ndarray) -> None:
        tr = ds.sample_transitions(B, sampler=per)
        per.update_priorities(tr.indices, new)

    return step


def lake_stream(path: Path) -> Callable[[np.ndarray], None]:
    ds = el.Dataset.open(str(path))
    stream = ds.segment_stream(1, batch_size=B, seed=0, sampler=el.Prioritized(1.0, alpha=ALPHA, beta=BETA))

    def step(new: np.ndarray) -> None:
        batch = stream.sample()
        stream.update_priorities(batch.indices, new)

    return step


def cpprb_buffer(episodes: int) -> Callable[[np.ndarray], None]:
    from cpprb import PrioritizedReplayBuffer

    env = {"obs": {"shape": 8}, "act": {"shape": 2}, "rew": {}, "next_obs": {"shape": 8}, "done": {}}
    rb = PrioritizedReplayBuffer(episodes * STEPS, env, alpha=ALPHA)
    for i in range(episodes):
        e = episode(i)
        done = np.zeros(STEPS, np.float32)
        done[-1] = 1
        rb.add(obs=e["obs"][:-1], act=e["act"], rew=e["rew"], next_obs=e["obs"][1:], done=done)

    def step(new: np.ndarray) -> None:
        batch = rb.sample(B, beta=BETA)
        rb.update_priorities(batch["indexes"], new)

    return step


def torchrl_buffer(episodes: int) -> Callable[[np.ndarray], None]:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

    n = episodes * STEPS
    rb = PrioritizedReplayBuffer(alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(n), batch_size=B)
    for i in range(episodes):
        e = episode(i)
        rb.extend(
            TensorDict(
                {
                    "obs": torch.from_numpy(e["obs"][:-1]),
                    "act": torch.from_numpy(e["act"]),
                    "rew": torch.from_numpy(e["rew"]),
                    "next_obs": torch.from_numpy(e["obs"][1:]),
                },
                batch_size=[STEPS],
            )
        )

    def step(new: np.ndarray) -> None:
        _, info = rb.sample(return_info=True)
        rb.update_priority(info["index"], torch.from_numpy(new))

    return step


def copy_limit(episodes: int) -> Callable[[np.ndarray], None]:
    """The copy part's bound: ``B`` uniform transitions (obs, act, rew, next_obs) gathered by NumPy from memory."""
    obs = np.concatenate([episode(i)["obs"] for i in range(episodes)])
    act = np.concatenate([episode(i)["act"] for i in range(episodes)])
    rew = np.concatenate([episode(i)["rew"] for i in range(episodes)])
    rng = np.random.default_rng(4)

    def step(new: np.ndarray) -> None:
        at = rng.integers(0, episodes * STEPS, B)
        row = at + at // STEPS  # each episode holds STEPS + 1 observation rows
        obs[row], act[at], rew[at], obs[row + 1]

    return step


def prioritized(root: Path, episodes: int, rounds: int, iters: int) -> None:
    print(f"== part 2: prioritized sample({B}) + update_priorities, {episodes * STEPS:,} transitions")
    lake = root / "lake"
    t0 = time.perf_counter()
    make_lake(lake, episodes)
    print(f"  (wrote the episodelake dataset in {time.perf_counter() - t0:.1f} s)")
    systems: dict[str, Callable[[np.ndarray], None]] = {}
    t0 = time.perf_counter()
    systems["cpprb PrioritizedReplayBuffer"] = cpprb_buffer(episodes)
    print(f"  (filled cpprb in {time.perf_counter() - t0:.1f} s)")
    systems[LIMIT] = copy_limit(episodes)
    systems["episodelake sample_transitions + PrioritizedSampler"] = lake_transitions(lake)
    systems["episodelake segment_stream(priority=)"] = lake_stream(lake)
    try:
        systems["TorchRL PrioritizedReplayBuffer"] = torchrl_buffer(episodes)
    except ImportError as exc:
        print(f"  TorchRL: not measured: not installed ({exc}); TorchRL 0.14.1's C++ sum tree does not load")
        print("    beside our torch 2.13.0 wheel (undefined symbol in torchrl/_torchrl.so)")
    except RuntimeError as exc:
        print(f"  TorchRL: not measured: {exc} (its C++ sum tree does not load beside torch 2.13.0)")
    rng = np.random.default_rng(0)
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for step in systems.values():  # warm-up
        for _ in range(20):
            step(np.abs(rng.standard_normal(B)) + 1e-3)
    for _ in range(rounds):
        for name, step in systems.items():
            news = [np.abs(rng.standard_normal(B)) + 1e-3 for _ in range(iters)]
            t0 = time.perf_counter()
            for new in news:
                step(new)
            rates[name].append(iters / (time.perf_counter() - t0))
    base = statistics.median(rates["cpprb PrioritizedReplayBuffer"])
    limit = statistics.median(rates[LIMIT])
    print(f"  ({LIMIT}: uniform draws, no priorities, same run)")
    for name, r in rates.items():
        med = statistics.median(r)
        print(
            f"  {name:55s} {med:8.0f} it/s (best {max(r):6.0f})   x{med / base:.2f} vs cpprb"
            f"   x{med / limit:.3f} the copy limit"
        )


SCHEMA = el.DatasetSchema(
    [
        el.FieldSpec("observation", (8,), "float32"),
        el.FieldSpec("action", (2,), "float32", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
    ]
)
CAPACITY = 100_000  # steps
EP_T = 100  # steps per episode in the online loop
SAMPLE_EVERY = 4


def prefill(ds: el.Dataset) -> None:
    """Fill ``ds`` to its capacity with one bulk import, so the loop evicts from its first commit on."""
    ds.append_episodes(
        {"observations": e["obs"][: EP_T + 1], "actions": e["act"][:EP_T], "rewards": e["rew"][:EP_T]}
        for e in (episode(i) for i in range(CAPACITY // EP_T))
    )
    ds.flush()


def store_and_sample(ds: el.Dataset, stream: SegmentStream, steps: int, obs: np.ndarray, act: np.ndarray) -> float:
    """Steps per second of the loop: one ``add_step`` per step, ``stream.sample()`` every 4 steps."""
    stream.sample()
    t0 = time.perf_counter()
    w = ds.new_episode(obs[0])
    for t in range(steps):
        end = (t + 1) % EP_T == 0
        w.add_step({"observations": obs[t + 1], "actions": act[t], "rewards": 1.0, "terminated": end})
        if end:
            w = ds.new_episode(obs[t + 1])
        if t % SAMPLE_EVERY == 0:
            stream.sample()
    return steps / (time.perf_counter() - t0)


def online_single(steps: int, obs: np.ndarray, act: np.ndarray) -> float:
    """The single-process form: one in-memory ``Dataset`` writes and samples, default stream options."""
    ds = el.Dataset.create(SCHEMA, capacity=CAPACITY)
    prefill(ds)
    stream = ds.segment_stream(el.Window(1), batch_size=B, seed=0, follow=True)
    rate = store_and_sample(ds, stream, steps, obs, act)
    assert ds.num_steps <= CAPACITY, "the buffer holds more than its capacity"
    stream.close()
    ds.close()
    return rate


def online_lake(root: Path, steps: int, obs: np.ndarray, act: np.ndarray) -> float:
    """The two-handle form: the writer's ``Dataset`` on disk, the learner's stream on a second handle."""
    path = str(root / "online")
    ds = el.Dataset.create(SCHEMA, path, capacity=CAPACITY, overwrite=True)
    prefill(ds)
    learner = el.Dataset.open(path)
    stream = learner.segment_stream(el.Window(1), batch_size=B, seed=0, follow=True, prefetch=0)
    rate = store_and_sample(ds, stream, steps, obs, act)
    assert len(learner) * EP_T <= CAPACITY, "the learner saw more than the capacity"
    ds.close()
    return rate


def online_cpprb(steps: int, obs: np.ndarray, act: np.ndarray) -> float:
    from cpprb import ReplayBuffer

    env = {"obs": {"shape": 8}, "act": {"shape": 2}, "rew": {}, "next_obs": {"shape": 8}, "done": {}}
    rb = ReplayBuffer(CAPACITY, env)
    for i in range(CAPACITY // EP_T):  # full ring
        e = episode(i)
        done = np.zeros(EP_T, np.float32)
        done[-1] = 1
        rb.add(
            obs=e["obs"][:EP_T], act=e["act"][:EP_T], rew=e["rew"][:EP_T], next_obs=e["obs"][1 : EP_T + 1], done=done
        )
    t0 = time.perf_counter()
    for t in range(steps):
        rb.add(obs=obs[t], act=act[t], rew=1.0, next_obs=obs[t + 1], done=float((t + 1) % EP_T == 0))
        if t % SAMPLE_EVERY == 0:
            rb.sample(B)
    return steps / (time.perf_counter() - t0)


def online_memmap(root: Path, steps: int, obs: np.ndarray, act: np.ndarray) -> float:
    from memmap_replay_buffer import ReplayBuffer, ReplayDatasetTimeWindow

    episodes = CAPACITY // EP_T
    buf = ReplayBuffer(
        str(root / "mrb"),
        max_episodes=episodes,
        max_timesteps=EP_T + 1,
        fields={"observation": ("float", 8), "action": ("float", 2), "reward": "float"},
        circular=True,
        overwrite=True,
    )
    for i in range(episodes):  # full ring
        e = episode(i)
        buf.store_episode(
            observation=e["obs"][: EP_T + 1],
            action=np.concatenate([e["act"][:EP_T], np.zeros((1, 2), np.float32)]),
            reward=np.append(e["rew"][:EP_T], np.float32(0)),
        )
    loader = buf.dataloader(B, dataset=ReplayDatasetTimeWindow(buf, window_length=2), shuffle=True)
    it = iter(loader)
    t0 = time.perf_counter()
    ep = buf.one_episode()
    ep.__enter__()
    for t in range(steps):
        buf.store(observation=obs[t], action=act[t], reward=1.0)
        if (t + 1) % EP_T == 0:
            ep.__exit__(None, None, None)
            ep = buf.one_episode()
            ep.__enter__()
        if t % SAMPLE_EVERY == 0:
            try:
                next(it)
            except StopIteration:
                it = iter(loader)
                next(it)
    ep.__exit__(None, None, None)
    return steps / (time.perf_counter() - t0)


def online(root: Path, steps: int, single_steps: int, memmap_steps: int, rounds: int) -> None:
    print(f"== part 1: online loop, capacity {CAPACITY:,} steps (full), sample({B}) every {SAMPLE_EVERY} steps")
    rng = np.random.default_rng(7)
    obs = rng.standard_normal((steps + 1, 8), dtype=np.float32)
    act = rng.standard_normal((steps, 2), dtype=np.float32)
    peer = "cpprb ReplayBuffer (in memory)"
    rates: dict[str, list[float]] = {}
    for r in range(rounds):  # the systems alternate, so background load hits all alike
        runs = {
            peer: lambda: online_cpprb(steps, obs, act),
            "episodelake one Dataset (in memory, follow=True)": lambda: online_single(single_steps, obs, act),
            "episodelake two handles (on disk, follow=True)": lambda: online_lake(root, steps, obs, act),
        }
        if r == 0:  # about 50 steps/s: one short round is enough
            runs["memmap-replay-buffer circular=True"] = lambda: online_memmap(root, memmap_steps, obs, act)
        for name, run in runs.items():
            try:
                rates.setdefault(name, []).append(run())
            except Exception as exc:  # a peer that fails is reported, not fatal
                print(f"  {name}: not measured: {type(exc).__name__}: {exc}")
    base = rates[peer]
    for name, rs in rates.items():
        ratios = [x / b for x, b in zip(rs, base, strict=False)]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(
            f"  {name:50s} {statistics.median(rs):9.0f} steps/s   x{statistics.median(ratios):.3f} vs cpprb "
            f"(median of {len(rs)} rounds: {each})"
        )


def refresh_latency(root: Path, sizes: list[int], rounds: int) -> None:
    print(f"== part 3: commit of one episode -> in the learner's stream, median of {rounds} rounds")
    for n in sizes:
        path = str(root / f"lat{n}")
        T = 10
        rng = np.random.default_rng(n)
        writer = el.Dataset.create(SCHEMA, path)
        t0 = time.perf_counter()
        writer.append_episodes(
            {
                "observations": rng.standard_normal((n * (T + 1), 8), dtype=np.float32),
                "actions": rng.standard_normal((n * T, 2), dtype=np.float32),
                "rewards": rng.standard_normal(n * T, dtype=np.float32),
                "terminated": np.ones(n, bool),
            },
            lengths=np.full(n, T),
        )
        writer.flush()
        built = time.perf_counter() - t0
        learner = el.Dataset.open(path)
        stream = learner.segment_stream(1, batch_size=B, seed=0, prefetch=0)
        stream.sample()
        one = {"observations": obs1(T), "actions": np.zeros((T, 2), np.float32), "rewards": np.ones(T, np.float32)}
        commits, lat = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            writer.append_episodes([one])
            writer.flush()
            t1 = time.perf_counter()
            assert stream.refresh()
            lat.append(time.perf_counter() - t1)
            commits.append(t1 - t0)
            stream.sample()
        assert len(stream.index) == (n + rounds) * T
        print(
            f"  {n:>7,} episodes (bulk import {built:5.1f} s): refresh median {statistics.median(lat) * 1e3:6.1f} ms"
            f" (p90 {sorted(lat)[int(0.9 * len(lat))] * 1e3:6.1f}), one-episode commit median"
            f" {statistics.median(commits) * 1e3:6.1f} ms"
        )
        writer.close()


def obs1(T: int) -> np.ndarray:
    return np.zeros((T + 1, 8), np.float32)


def main() -> None:
    import torch

    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k transitions instead of 1M")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200, help="iterations per round and system")
    ap.add_argument("--dir", default=None, help="where to write the dataset (default: a temporary directory)")
    ap.add_argument("--parts", default="1,2,3", help="which parts to run, comma-separated")
    ap.add_argument("--online-steps", type=int, default=20_000, help="part 1: steps per system")
    ap.add_argument("--single-steps", type=int, default=20_000, help="part 1: steps for the one-Dataset form")
    ap.add_argument("--online-rounds", type=int, default=3, help="part 1: rounds per system")
    ap.add_argument("--memmap-steps", type=int, default=1_000, help="part 1: steps for memmap-replay-buffer")
    args = ap.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    root = Path(tempfile.mkdtemp(prefix="bench_replay_", dir=args.dir))
    try:
        if 1 in parts:
            online(root, args.online_steps, args.single_steps, args.memmap_steps, args.online_rounds)
        if 2 in parts:
            prioritized(root, 100 if args.quick else 1000, args.rounds, args.iters)
        if 3 in parts:
            refresh_latency(root, [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000], 30)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
