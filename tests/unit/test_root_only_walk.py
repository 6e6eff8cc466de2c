"""A relative path is walked from the working directory, not from /."""

import os

from vgpu_driver import root_only


def test_a_relative_path_is_walked_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "img" / "usr").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    walked = [path for path, _ in root_only.walk("img/usr")]
    assert walked[-1] == os.path.join(str(tmp_path), "img", "usr")
