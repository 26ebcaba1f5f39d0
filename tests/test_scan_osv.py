"""OSV records against Python packages: ECOSYSTEM ranges (introduced, fixed, last_affected),
`versions` lists, withdrawn records, other ecosystems, a zip or a folder; a bad file is one line."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version
from support.fuzz import fuzz_examples

from imagebuilder.scan.osv import BadOsv, Record, load_osv, matches, parse_record


def _record(vid: str, name: str = "requests", ranges: list[object] | None = None, versions: list[str] | None = None,
            ecosystem: str = "PyPI", **extra: object) -> dict[str, object]:
    affected: dict[str, object] = {"package": {"ecosystem": ecosystem, "name": name}}
    if ranges is not None:
        affected["ranges"] = ranges
    if versions is not None:
        affected["versions"] = versions
    return {"id": vid, "aliases": [f"CVE-{vid}"], "affected": [affected], **extra}


def _range(*events: dict[str, str], kind: str = "ECOSYSTEM") -> dict[str, object]:
    return {"type": kind, "events": list(events)}


RECORDS = [
    _record("R1", ranges=[_range({"introduced": "0"}, {"fixed": "2.32.0"})]),
    _record("R2", ranges=[_range({"introduced": "2.0"}, {"fixed": "2.3.1"}, {"introduced": "2.30.0"},
                                 {"last_affected": "2.31.0"})]),
    _record("R3", versions=["2.31.0", "2.31.0rc1"]),
    _record("R4", ranges=[_range({"introduced": "0"}, {"fixed": "9"}, kind="GIT")]),  # git ranges: not ours
    _record("R5", ranges=[_range({"introduced": "0"})], withdrawn="2025-01-01T00:00:00Z"),
    _record("R6", ranges=[_range({"introduced": "0"})], ecosystem="npm"),
    _record("R7", name="Requests_Toolbelt", ranges=[_range({"introduced": "1.0"})]),  # no fix yet
    _record("R8", ranges=[_range({"introduced": "0"}, {"fixed": "not a version!"})]),  # a range we cannot place
]

# (package, version, the records that affect it, with the first fix above it)
CASES = [
    ("requests", "2.31.0", [("R1", "2.32.0"), ("R2", None), ("R3", None)]),
    ("requests", "2.32.0", []),
    ("requests", "2.2", [("R1", "2.32.0"), ("R2", "2.3.1")]),
    ("requests", "2.3.1", [("R1", "2.32.0")]),
    ("requests", "1.9", [("R1", "2.32.0")]),
    ("requests", "2.31.1", [("R1", "2.32.0")]),  # after last_affected
    ("requests", "2.31.0rc1", [("R1", "2.32.0"), ("R2", None), ("R3", None)]),
    ("requests-toolbelt", "1.0.0", [("R7", None)]),
    ("requests.toolbelt", "0.9", []),
    ("urllib3", "1.0", []),
]


@pytest.fixture(params=["folder", "zip"])
def osv_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "folder":
        for record in RECORDS:
            (tmp_path / f"{record['id']}.json").write_text(json.dumps(record))
        return tmp_path
    path = tmp_path / "all.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for record in RECORDS:
            archive.writestr(f"{record['id']}.json", json.dumps(record))
    return path


@pytest.mark.parametrize(("name", "version", "want"), CASES)
def test_records_that_affect_a_version(osv_file, name, version, want):
    records = load_osv(osv_file)
    got = [(m.record.id, str(m.fixed) if m.fixed else None) for m in matches(records, name, Version(version))]
    assert sorted(got) == want


def test_a_match_carries_the_aliases():
    records = load_osv_from([RECORDS[0]])
    (match,) = matches(records, "requests", Version("1.0"))
    assert (match.record.id, match.record.aliases) == ("R1", ("CVE-R1",))


def load_osv_from(records: list[dict[str, object]]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for raw in records:
        record = parse_record(raw, "x.json")
        assert record is not None
        out.setdefault(record.affected[0].name, []).append(record)
    return out


@pytest.mark.parametrize(("content", "said"), [
    (b"not json", "not JSON"),
    (b"[1, 2]", "not an OSV record"),
    (b'{"affected": []}', "not an OSV record"),
])
def test_a_bad_record_is_one_line(tmp_path: Path, content: bytes, said: str):
    (tmp_path / "x.json").write_bytes(content)
    with pytest.raises(BadOsv, match=said) as caught:
        load_osv(tmp_path)
    assert str(caught.value).startswith(str(tmp_path / "x.json")) and caught.value.exit_status == 2


def test_a_file_that_is_no_zip_or_missing_is_one_line(tmp_path: Path):
    (tmp_path / "all.zip").write_bytes(b"PK not really")
    with pytest.raises(BadOsv, match="not a zip of OSV records"):
        load_osv(tmp_path / "all.zip")
    with pytest.raises(BadOsv, match="no such file or folder"):
        load_osv(tmp_path / "nope.zip")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                         st.sampled_from(["id", "affected", "package", "ecosystem", "name", "ranges", "type", "events",
                                          "introduced", "fixed", "versions", "aliases", "withdrawn"]), inner, max_size=4),
                     max_leaves=20)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(_json)
def test_any_json_is_a_record_nothing_or_one_line(raw: object):
    try:
        record = parse_record(raw, "x.json")
    except BadOsv as e:
        assert "\n" not in str(e)
        return
    if record is not None:
        for affected in record.affected:
            matches({affected.name: [record]}, affected.name, Version("1.0"))
