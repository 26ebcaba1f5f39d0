"""torchaudio 2.9+ loads and saves through torchcodec, which loads the OS's FFmpeg: the images of
those releases install both (issue 20 item 5); older releases render as before."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.lock.lockfile import parse_lock, requirements
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve
from imagebuilder.resources import default_matrix_path

from support.real_images import DEVEL_CUDA, DEVEL_TORCH

M = load_matrix(default_matrix_path())
FFMPEG = {"debian12": "libavcodec59", "debian13": "libavcodec61", "ubuntu22.04": "libavcodec58",
          "ubuntu24.04": "libavcodec60"}


def _final_stage(dockerfile: str) -> str:
    return dockerfile.split("\nFROM ${BASE_IMAGE}\n", 1)[1]


@pytest.mark.parametrize("os_name", sorted(FFMPEG))
@pytest.mark.parametrize("torch, cuda, codec", [("2.9", "12.8", "0.9.1"), ("2.13", "13.0", "0.16.0")])
def test_a_release_whose_torchaudio_needs_torchcodec_installs_it_and_the_os_ffmpeg(torch, cuda, codec, os_name):
    spec = resolve(M, Request(torch, cuda, os=os_name))
    assert f"torchcodec=={codec}" in requirements(spec, M)
    final = _final_stage(render(spec, M).dockerfile)
    install = next(line for line in final.splitlines() if "apt-get install" in line)
    for package in M.oses[os_name].ffmpeg:
        assert f" {package}" in install
    assert FFMPEG[os_name] in M.oses[os_name].ffmpeg
    assert not any(p.endswith("-dev") for p in M.oses[os_name].ffmpeg)


@pytest.mark.parametrize("torch, cuda", [("2.6", "12.4"), ("2.8", "12.8"), ("2.12", "13.0")])
def test_a_release_without_a_torchaudio_that_needs_it_gets_neither(torch, cuda):
    spec = resolve(M, Request(torch, cuda, os="debian12"))
    assert not any(r.startswith("torchcodec") for r in requirements(spec, M))
    dockerfile = render(spec, M).dockerfile
    assert "libav" not in dockerfile and "torchcodec" not in dockerfile


def test_a_python_torchcodec_has_no_wheel_for_gets_none():
    spec = resolve(M, Request("2.15", "13.2", os="debian12", python="3.15"))
    assert not any(r.startswith("torchcodec") for r in requirements(spec, M))
    assert "libav" not in render(spec, M).dockerfile


def test_every_lock_of_such_a_release_pins_torchcodec_and_protects_it():
    checked = 0
    for release in M.torches.values():
        if release.torchcodec is None:
            continue
        for path in sorted(default_matrix_path().parent.glob(f"locks/torch{release.version}-*.txt")):
            if "jupyter" in path.name:  # a jupyter lock holds only what it adds to its parent
                continue
            python = Version(path.name.split("-py", 1)[1].split("-", 1)[0])
            lock = parse_lock(path.stem, path.read_text())
            pins = {p.name: p.version for p in lock.pins}
            assert pins.get("torchcodec") == release.torchcodec_for(python), path.name
            assert f"torchcodec=={release.torchcodec.version}" in lock.constraints(), path.name
            checked += 1
    assert checked >= 20


def test_the_matrix_refuses_torchcodec_without_the_os_ffmpeg(tmp_path):
    from imagebuilder.matrix.model import MatrixError

    text = default_matrix_path().read_text()
    text = text.replace("ffmpeg: [libavcodec59, libavdevice59, libavfilter8, libavformat59, libavutil57, "
                        "libswresample4, libswscale6], ", "", 1)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(MatrixError, match="debian12.*ffmpeg"):
        load_matrix(path)


# --- for real: a built image saves and loads a WAV and decodes a JPEG -----------------------

MEDIA = r"""
import json, math, torch, torchaudio, torchvision
from torchvision.io import decode_jpeg, encode_jpeg, read_image
rate = 16000
t = torch.arange(rate, dtype=torch.float32) / rate
wave = 0.5 * torch.sin(2 * math.pi * 440 * t).unsqueeze(0)
torchaudio.save("/tmp/sine.wav", wave, rate)
loaded, loaded_rate = torchaudio.load("/tmp/sine.wav")
image = torch.zeros(3, 32, 48, dtype=torch.uint8); image[0] = 200
data = encode_jpeg(image)
open("/tmp/red.jpg", "wb").write(data.numpy().tobytes())
decoded, read = decode_jpeg(data), read_image("/tmp/red.jpg")
print(json.dumps({"shape": list(loaded.shape), "rate": loaded_rate,
                  "error": float((loaded - wave).abs().max()),
                  "jpeg": list(decoded.shape), "read": list(read.shape), "red": int(read[0].float().mean())}))
"""

CODEC_TORCH, CODEC_CUDA = "2.13", "13.0"


@pytest.mark.docker
@pytest.mark.slow
def test_a_built_image_saves_and_loads_a_wav_and_decodes_a_jpeg(docker_engine, devel_image):
    """On the session's devel image (torch 2.13: its torchaudio needs torchcodec and the OS's
    FFmpeg; devel installs what runtime does): no image of its own."""
    assert (DEVEL_TORCH, DEVEL_CUDA) == (CODEC_TORCH, CODEC_CUDA)
    spec = resolve(M, Request(CODEC_TORCH, CODEC_CUDA, os="debian12", variant="devel"))
    assert any(r.startswith("torchcodec==") for r in requirements(spec, M))
    # The session's devel image is its family's (support.policy's IMAGE_FAMILIES): test_buildkit's
    # layers served every step but the FROM, though modules ran and finished in between.
    assert devel_image["cached_steps"] == devel_image["steps"] - 1, (devel_image["cached_steps"], devel_image["steps"])
    ref = devel_image["tags"][0]
    result = docker_engine.run(ref, ["python", "-c", MEDIA], timeout=300)
    assert not result.timed_out and result.exit_code == 0, result.output[-3000:]
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["shape"] == [1, 16000] and out["rate"] == 16000
    assert out["error"] < 1e-3  # 16-bit PCM's rounding, far below the 0.5 amplitude
    assert out["jpeg"] == out["read"] == [3, 32, 48]
    assert 150 < out["red"] < 250
