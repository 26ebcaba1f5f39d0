"""`matrix add`: text insertion that keeps the file, refusals, and (network) a block equal to today's.

The network test reads the index as `matrix check --online` does, like test_drift.py (seconds:
page reads and range requests, no wheel downloaded).
"""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.version import Version

from support.matrix_text import remove_block
from imagebuilder.cli import cli
from imagebuilder.lock.index import PackageIndex
from imagebuilder.lock.matrix_add import CannotAdd, NewRelease, Variant, add_release, block_text, insert_block
from imagebuilder.matrix.load import load_matrix, parse_matrix
from imagebuilder.resources import default_matrix_path

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"


def release(version: str = "2.9.1", cuda: str = "12.8.90", torchaudio: str = "2.8.0") -> NewRelease:
    """A release whose torchaudio (below 2.9) needs no torchcodec, unless `torchaudio` says so."""
    variant = Variant("cu128", Version(cuda), Version("9.10.2.21"), Version("2.27.5"),
                      "https://download.pytorch.org/whl/cu128", "test: Requires-Dist")
    return NewRelease(Version(version), Version("0.24.1"), Version(torchaudio), Version("3.5.1"),
                      (Version("3.10"), Version("3.11")), ("linux/amd64",), variant, (), "test source", ())


@pytest.mark.parametrize("version,after,before", [
    ("2.9.1", '  "2.6":', '  "2.12":'),  # between two releases
    ("2.5.1", "torch:", '  "2.6":'),      # first
    ("2.13.0", '    version: "2.12.0"', None),  # last, at the end of the file
])
def test_the_block_goes_in_version_order_and_the_rest_of_the_file_stays(version, after, before):
    text = SMALL.read_text()
    block = block_text(release(version))
    new = insert_block(text, block.split('"')[1], block)
    assert new.replace(block, "") == text  # comments, order and every other byte kept
    position = new.index(block)
    assert new.index(after) < position and (before is None or position < new.index(before))
    m = parse_matrix(new, SMALL)
    added = m.torches[f"{Version(version).major}.{Version(version).minor}"]
    assert (added.version, added.torchvision, added.pythons) == (Version(version), Version("0.24.1"),
                                                                 (Version("3.10"), Version("3.11")))
    assert added.variant("cu128").cuda == Version("12.8") and added.variant("cu128").source


def test_a_release_comment_stays_with_its_block():
    text = SMALL.read_text().replace('  "2.12":', '  # 2.12: hand-kept note\n  "2.12":')
    block = block_text(release("2.9.1"))
    new = insert_block(text, "2.9", block)
    assert block + '  # 2.12: hand-kept note\n  "2.12":' in new


def test_a_release_the_matrix_has_is_refused_before_the_index_is_asked(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(SMALL.read_text())
    with pytest.raises(CannotAdd, match="already has torch 2.6 .2.6.0.; remove that block first"):
        add_release(PackageIndex("http://127.0.0.1:9/"), load_matrix(path), Version("2.6.0"))
    assert path.read_text() == SMALL.read_text()


@pytest.mark.parametrize("args,message", [
    (["matrix", "add"], "give either --torch X.Y.Z or --new"),
    (["matrix", "add", "--torch", "2.15.0", "--new"], "give either --torch X.Y.Z or --new"),
    (["matrix", "add", "--torch", "2.15"], "give the full release"),
    (["matrix", "add", "--torch", "two"], "not a version"),
])
def test_bad_requests_exit_2_with_one_line(args, message):
    result = CliRunner().invoke(cli, ["--matrix", str(SMALL), *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_every_variant_in_the_packaged_matrix_names_its_source():
    for key, torch in load_matrix(default_matrix_path()).torches.items():
        assert torch.source, key
        for variant in torch.variants:
            assert len(variant.source) > 20, (key, variant.name)  # a source, not a placeholder


def test_a_release_whose_torchaudio_needs_torchcodec_says_the_block_lacks_it(tmp_path, monkeypatch):
    """torchaudio 2.9+ loads and saves audio through torchcodec, which no Requires-Dist names:
    the block is written, `matrix add` says what it could not fill, and `matrix check` fails it."""
    from imagebuilder.lock import matrix_add

    monkeypatch.setattr(matrix_add, "read_release", lambda index, version, cuda_variants=(): release("2.13.0", torchaudio="2.13.0"))
    path = tmp_path / "m.yaml"
    path.write_text(SMALL.read_text())
    result = CliRunner().invoke(cli, ["--matrix", str(path), "matrix", "add", "--torch", "2.13.0"])
    assert result.exit_code == 0, result.output
    assert "note: left for you: " in result.stderr and "torch.2.13.torchcodec: missing: torchaudio 2.13.0" in result.stderr
    check = CliRunner().invoke(cli, ["--matrix", str(path), "matrix", "check"])
    assert check.exit_code == 2 and "torch.2.13.torchcodec: missing" in check.stderr


@pytest.mark.network
def test_matrix_add_writes_2_14_equal_in_every_pin_to_todays(tmp_path):
    today = load_matrix(default_matrix_path())
    path = tmp_path / "matrix.yaml"
    path.write_text(remove_block(today.text, "2.14"))
    assert "2.14" not in load_matrix(path).torches
    result = CliRunner().invoke(cli, ["--matrix", str(path), "matrix", "add", "--torch", str(today.torches["2.14"].version)])
    assert result.exit_code == 0, result.output
    # torchcodec is what no metadata names: left for the user (today's line, put in by hand).
    assert "torch.2.14.torchcodec: missing" in result.output
    codec = next(line for line in today.text.split('  "2.14":', 1)[1].splitlines() if line.startswith("    torchcodec:"))
    path.write_text(path.read_text().replace('  "2.14":\n', '  "2.14":\n' + codec + "\n", 1))
    added, want = load_matrix(path).torches["2.14"], today.torches["2.14"]
    pins = ("version", "torchvision", "torchaudio", "triton", "pythons", "pypi_variant", "platforms")
    assert {p: getattr(added, p) for p in pins} == {p: getattr(want, p) for p in pins}
    for got in added.variants:  # the PyPI build; other variants come from PyTorch's own index
        expected = want.variant(got.name)
        assert (got.cuda, got.cudnn, got.nccl, got.index) == (expected.cuda, expected.cudnn, expected.nccl, expected.index)
        assert got.source.startswith("PyPI torch 2.14.1 Requires-Dist")
    assert "PyPI torch 2.14.1 wheels" in added.source
    # Only the block went in: the file minus the new block is the file it was.
    assert remove_block(path.read_text(), "2.14") == remove_block(today.text, "2.14")


@pytest.fixture(params=["refuses", "does not answer"])
def dead_index(request, monkeypatch):
    """An index URL on 127.0.0.1 whose port refuses connections, or accepts them and never answers."""
    from imagebuilder.lock import index

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    if request.param == "refuses":
        server.close()
    else:
        server.listen(8)  # the kernel completes the handshake; nothing ever reads or answers
        monkeypatch.setattr(index, "POLICY", replace(index.POLICY, timeout_s=1.0))
    yield f"127.0.0.1:{port}"
    server.close()


@pytest.mark.parametrize("args", [
    ["matrix", "add", "--new"],
    ["matrix", "add", "--torch", "2.16.0"],
    ["matrix", "check", "--online"],
])
def test_an_unreachable_index_is_an_error_that_names_its_host(dead_index, args, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(SMALL.read_text())
    result = CliRunner().invoke(cli, ["--matrix", str(path), *args, "--index-url", f"http://{dead_index}/simple/"])
    assert result.exit_code == 1, result.output
    assert f"cannot read the package index at {dead_index}: " in result.output, result.output
    assert "no release the matrix lacks" not in result.output and "no Linux x86_64 wheel" not in result.output
    assert path.read_text() == SMALL.read_text()


def test_an_unreachable_pytorch_index_is_named_and_nothing_is_guessed(monkeypatch):
    from imagebuilder.lock import matrix_add

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setattr(matrix_add, "PYTORCH_INDEX", f"http://127.0.0.1:{port}/whl/{{variant}}")
    with pytest.raises(CannotAdd) as e:
        matrix_add._pytorch_index_variant(Version("2.14.1"), "cu126", Version("3.11"))
    assert str(e.value).startswith(f"cannot add torch 2.14.1: cu126: cannot read the package index at 127.0.0.1:{port}: ")
    assert str(e.value).endswith("; add that variant by hand from a primary source")


def test_what_metadata_cannot_say_is_left_for_the_user_and_named(tmp_path, monkeypatch):
    """A release on a CUDA the matrix has no block for: the block is written, and the problem
    `matrix check` reports is handed back instead of a guessed CUDA block."""
    from imagebuilder.lock import matrix_add

    new = release("2.9.1", cuda="12.9.79")
    new = NewRelease(**{**new.__dict__, "pypi_variant": Variant("cu129", Version("12.9.79"), Version("9.10.2.21"),
                                                                Version("2.27.5"), "https://download.pytorch.org/whl/cu129", "test")})
    monkeypatch.setattr(matrix_add, "read_release", lambda index, version, cuda_variants=(): new)
    path = tmp_path / "m.yaml"
    path.write_text(SMALL.read_text())
    block, todo = add_release(PackageIndex("http://127.0.0.1:9/"), load_matrix(path), Version("2.9.1"))
    assert block in path.read_text()
    assert len(todo) == 1 and "torch.2.9.variants.cu129.cuda: unknown CUDA 12.9; add it under cuda:" in todo[0]
    assert list(tmp_path.iterdir()) == [path]  # replaced in place, no temporary file left
