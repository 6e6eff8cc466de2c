"""The README says how many Debian packages the test command installs."""

import pathlib
import re

TOP = pathlib.Path(__file__).parents[2]


def test_the_readme_counts_bindeps_packages():
    packages = [
        line.split()[0]
        for line in (TOP / "bindep.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    said = re.search(
        r"installs the (\d+) Debian packages of ``bindep.txt``", (TOP / "README.rst").read_text()
    )
    assert said and int(said[1]) == len(packages)
