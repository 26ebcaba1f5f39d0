"""The allowlist file: what it accepts, every malformed file refused whole in one line naming the
file, the entry and its line (exit 2), and no traceback for any input (generated ones too)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fuzz import fuzz_examples

from imagebuilder.cli import cli
from imagebuilder.scan.allowlist import AllowlistError, load_allowlist, parse_allowlist

GOOD = """\
- id: CVE-2026-1111
  reason: the vulnerable code is not reachable here
  expires: 2027-03-31
- id: GHSA-23cf-ghjm-pqrv
  reason: "quoted: fine"
  expires: '2026-12-06'
- {id: PYSEC-2024-48, reason: flow style, expires: 2026-01-01}
"""


def test_a_good_allowlist():
    allowlist = parse_allowlist(GOOD, "allow.yaml")
    assert [(e.id, e.expires, e.line) for e in allowlist.entries] == [
        ("CVE-2026-1111", date(2027, 3, 31), 1), ("GHSA-23cf-ghjm-pqrv", date(2026, 12, 6), 4),
        ("PYSEC-2024-48", date(2026, 1, 1), 7)]
    entry = allowlist.entry("GHSA-23cf-ghjm-pqrv")
    assert entry is not None and not entry.expired(date(2026, 12, 6)) and entry.expired(date(2026, 12, 7))
    assert parse_allowlist("", "empty.yaml").entries == () and parse_allowlist("[]", "e.yaml").entries == ()


# (the file's text, the problems the one line names after "allow.yaml: ")
MALFORMED = [
    ("id: CVE-2026-1111\n", "not a list of entries"),
    ("just text\n", "not a list of entries"),
    ("- CVE-2026-1111\n", "entry 1 (line 1): not a mapping of id, reason, expires"),
    ("- id: CVE-2026-1111\n  expires: 2027-01-01\n", "entry 1 (line 1): missing 'reason'"),
    ("- id: CVE-2026-1111\n  reason: r\n  expires: 2027-02-30\n",
     "entry 1 (line 1): expires '2027-02-30' is not a date YYYY-MM-DD"),
    ("- id: CVE-2026-1111\n  reason: r\n  expires: 27-1-1\n", "entry 1 (line 1): expires '27-1-1' is not a date"),
    ("- id: cve-2026-1111\n  reason: r\n  expires: 2027-01-01\n", "entry 1 (line 1): id 'cve-2026-1111' is not a CVE id"),
    ("- id: CVE-26-1\n  reason: r\n  expires: 2027-01-01\n", "id 'CVE-26-1' is not a CVE id"),
    ("- id: CVE-2026-1111\n  reason: r\n  expires: 2027-01-01\n  owner: me\n",
     "entry 1 (line 1): unknown key 'owner' (the keys are id, reason, expires)"),
    ("- id: CVE-2026-1111\n  reason: r\n  expires: 2027-01-01\n- id: CVE-2026-1111\n  reason: again\n"
     "  expires: 2027-01-01\n", "entry 2 (line 4): id CVE-2026-1111 again (first in entry 1)"),
    ("- id: CVE-2026-1111\n  reason: [a, b]\n  expires: 2027-01-01\n", "'reason' is not a plain non-empty value"),
    ("- id: CVE-2026-1111\n  reason: ''\n  expires: 2027-01-01\n", "'reason' is not a plain non-empty value"),
    ("- id: CVE-2026-1111\n  id: CVE-2026-2222\n  reason: r\n  expires: 2027-01-01\n", "'id' twice"),
    ("- id: [CVE-2026-1111\n", "not YAML (line 2)"),
    ("- id: *nowhere\n", "not YAML (line 1): found undefined alias 'nowhere'"),
    ("- \x00\n", "not YAML"),
    ("- ok: 1\n- id: CVE-2026-1111\n  reason: r\n  expires: nope\n",  # every problem, in one line
     "entry 1 (line 1): unknown key 'ok' (the keys are id, reason, expires); entry 1 (line 1): missing 'id', "
     "'reason', 'expires'; entry 2 (line 2): expires 'nope' is not a date YYYY-MM-DD"),
]


@pytest.mark.parametrize(("text", "problem"), MALFORMED)
def test_a_malformed_allowlist_is_one_line_naming_the_entry(text, problem):
    with pytest.raises(AllowlistError) as caught:
        parse_allowlist(text, "allow.yaml")
    line = str(caught.value)
    assert line.startswith("allow.yaml: ") and problem in line, line
    assert "\n" not in line and caught.value.exit_status == 2


def test_a_file_that_cannot_be_read(tmp_path: Path):
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe- id")
    for path, said in ((tmp_path / "none.yaml", "No such file"), (tmp_path, "Is a directory"),
                       (tmp_path / "bin.yaml", "UnicodeDecodeError")):
        with pytest.raises(AllowlistError, match=said) as caught:
            load_allowlist(path)
        assert "\n" not in str(caught.value)


def test_the_command_says_it_in_one_line_and_exits_2(tmp_path: Path):
    allow = tmp_path / "allow.yaml"
    allow.write_text(MALFORMED[3][0])
    result = CliRunner().invoke(cli, ["scan", "any:image", "--allowlist", str(allow)])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: {allow}: entry 1 (line 1): missing 'reason'"]


_scalars = st.one_of(st.text(max_size=12), st.integers(), st.booleans(), st.none(), st.dates().map(str),
                     st.sampled_from(["CVE-2026-1111", "GHSA-23cf-ghjm-pqrv", "2027-01-01", "id", "reason"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["id", "reason", "expires", "other"]) | st.text(max_size=5), inner, max_size=4), max_leaves=12)


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(_values)
def test_any_yaml_document_is_an_allowlist_or_one_line(value: object):
    try:
        parse_allowlist(yaml.safe_dump(value), "f.yaml")
    except AllowlistError as e:
        assert "\n" not in str(e) and str(e).startswith("f.yaml: ")


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(st.text(alphabet=st.sampled_from(list("- :\n'\"[]{}&*!|>#%@`\t\\ab1CVE")), max_size=60))
def test_any_text_is_an_allowlist_or_one_line(text: str):
    try:
        parse_allowlist(text, "f.yaml")
    except AllowlistError as e:
        assert "\n" not in str(e)
