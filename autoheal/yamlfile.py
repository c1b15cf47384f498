"""Read a YAML file with an error that names the file and what it was for.

The runner's config and its routing rules are both hand-edited YAML; a typo must come back as
"<path>: not valid YAML: ..." in the caller's own error type, never as a bare parser traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autoheal.errors import ConfigError


def read_yaml(path: Path, what: str, error: type[ConfigError] = ConfigError) -> Any:
    """The parsed document of `path` (`what` names it in errors, e.g. "the rules file")."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from exc
