"""The golden-file helper fails on a difference and rewrites only when asked."""

import pytest

from tests import golden


@pytest.fixture
def golden_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(golden, "GOLDEN_DIR", str(tmp_path))
    monkeypatch.delenv(golden.REGENERATE, raising=False)
    return tmp_path


def test_equal_text_passes_and_a_difference_fails_with_a_diff(golden_dir):
    (golden_dir / "out.txt").write_text("a\nb\n")
    golden.assert_golden("out.txt", "a\nb\n")
    with pytest.raises(AssertionError, match=r"(?s)tests/golden/out.txt.*-b\n\+c"):
        golden.assert_golden("out.txt", "a\nc\n")


def test_a_missing_file_fails(golden_dir):
    with pytest.raises(AssertionError, match="no golden file"):
        golden.assert_golden("none.txt", "x")
    assert not (golden_dir / "none.txt").exists()


def test_regenerating_writes_the_file(golden_dir, monkeypatch):
    monkeypatch.setenv(golden.REGENERATE, "1")
    golden.assert_golden("sub/new.txt", "new\n")
    assert (golden_dir / "sub" / "new.txt").read_text() == "new\n"
    monkeypatch.setenv(golden.REGENERATE, "0")
    with pytest.raises(AssertionError):
        golden.assert_golden("sub/new.txt", "other\n")
