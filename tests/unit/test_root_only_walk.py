"""A relative path is walked from the working directory, not from /."""

import os

import pytest

from vgpu_driver import root_only


def test_a_relative_path_is_walked_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "img" / "usr").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    walked = [path for path, _ in root_only.walk("img/usr")]
    assert walked[-1] == os.path.join(str(tmp_path), "img", "usr")


def test_a_link_another_user_owns_in_a_sticky_directory_is_named(tmp_path):
    """In /tmp-like directories a link's owner may replace it."""
    if os.geteuid() != 0:
        pytest.skip("giving a link to another user needs root")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    target = tmp_path / "script"
    target.write_text("#!/bin/sh\n")
    link = shared / "script"
    link.symlink_to(target)
    assert root_only.problems(str(link)) == []
    os.lchown(link, 65534, 65534)
    [problem] = root_only.problems(str(link))
    assert problem.startswith(f"{link} (a link owned by ")
    assert problem.endswith(") can be changed by another user than root")
