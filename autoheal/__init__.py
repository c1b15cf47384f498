"""autoheal: self-healing GPU training clusters.

`__version__` is the one version of a release: the Python package (pyproject.toml reads it from
here), the Ansible collection (galaxy.yml), the runner image's tag, `autoheal --version`, and
the version the runner records for every run. tests/packaging/test_version.py keeps them equal;
CHANGELOG.md has an entry for each.
"""

__version__ = "0.3.0"
