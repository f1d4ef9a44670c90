"""A separate virtualenv with the real ``lerobot`` package, for tests that check against it.

lerobot 0.4.4 (the newest release for Python 3.11 here) pins ``torch<2.11``,
and PyPI's torchvision does not import beside the project's torch 2.13.0, so
the package cannot live in the project's environment. :func:`lerobot_python`
builds (once, cached under ``~/.cache`` by the versions) a virtualenv with a
torch/torchvision pair that installs from this machine's disk,
``lerobot --no-deps`` and only what its dataset module imports, and returns
its interpreter. Its video decoder is torchcodec (torchvision 0.29 has no
video reader), which needs the system's FFmpeg libraries (Debian:
``libavcodec59 libavformat59 libavutil57 libavdevice59 libavfilter8
libswscale6 libswresample4``).
"""

from __future__ import annotations

import ctypes.util
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LEROBOT = "0.4.4"
# torch/torchvision pairs that pip installs here (see the machine notes); torchcodec built for that torch
PAIRS = {
    "x86_64": ("torch==2.14.1", "torchvision==0.29.1", "torchcodec==0.13.0"),
    "aarch64": ("torch==2.9.1", "torchvision==0.24.1", "torchcodec==0.8.1"),
}
# what lerobot.datasets.lerobot_dataset imports, within lerobot's own pins
DEPS = (
    "datasets>=4,<5",
    "huggingface-hub>=0.34.2,<0.36",
    "av>=15,<16",
    "jsonlines>=4,<5",
    "einops>=0.8,<0.9",
    "packaging>=24.2,<26",
    "draccus==0.10.0",
    "numpy<2.4",  # numpy 2.4 refuses float() of a 1-element array, which LeRobot's writer does for (1,) features
)
NO_DEPS = (f"lerobot=={LEROBOT}", "accelerate>=1.10,<2", "safetensors")
FFMPEG_LIBS = ("avcodec", "avformat", "avutil", "swscale")


def venv_dir() -> Path:
    pair = PAIRS[platform.machine()]
    recipe = hashlib.sha256(repr((pair, DEPS, NO_DEPS)).encode()).hexdigest()[:8]
    key = "-".join([LEROBOT, *(p.split("==")[1] for p in pair), recipe])
    return Path(
        os.environ.get("EPISODELAKE_LEROBOT_VENV") or Path.home() / ".cache" / f"episodelake-lerobot-venv-{key}"
    )


def missing_ffmpeg() -> list[str]:
    return [lib for lib in FFMPEG_LIBS if ctypes.util.find_library(lib) is None]


def lerobot_python() -> Path:
    """The interpreter of the cached lerobot virtualenv, built on first use (a few minutes, ~6 GB)."""
    if platform.machine() not in PAIRS:
        raise RuntimeError(f"no known torch/torchvision pair for {platform.machine()}")
    if missing_ffmpeg():
        raise RuntimeError(
            f"FFmpeg libraries {missing_ffmpeg()} missing (torchcodec needs them): apt-get install "
            "libavcodec59 libavformat59 libavutil57 libavdevice59 libavfilter8 libswscale6 libswresample4"
        )
    final = venv_dir()
    python = final / "bin" / "python"
    if python.exists():
        return python
    final.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(build)], check=True)
        pip = [str(build / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        torch, vision, codec = PAIRS[platform.machine()]
        subprocess.run([*pip, torch, vision], check=True)
        subprocess.run([*pip, "--no-deps", *NO_DEPS, codec], check=True)
        subprocess.run([*pip, *DEPS], check=True)
        check = "import lerobot.datasets.lerobot_dataset, torchcodec.decoders"
        subprocess.run([str(build / "bin" / "python"), "-c", check], check=True)
        # built aside and renamed whole, so a half-built venv is never taken as done (its python runs
        # from the new path; only the pip launcher scripts keep the old one, and nothing uses them)
        os.rename(build, final)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        if python.exists():  # another process finished the same build first
            return python
        raise
    return python
