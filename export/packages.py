"""Export inputs that come inside installed packages (weights, data files): found by the
pinned distribution, so that a different version is an error, not a silent new model.
(Its own module: export/common.py is part of every artifact's cache key.)"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path


class PackageMissingError(FileNotFoundError):
    """A package that carries an export's input (weights, data) is not installed, or is
    another version than the one the export was verified with."""


def package_file(distribution: str, version: str, path: str) -> tuple[Path, str]:
    """(the file or folder `path` inside the installed `distribution`==`version`, the
    distribution's licence): the export reads it; none of the package's code runs."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise PackageMissingError(
            f"{distribution}=={version} is not installed: scripts/setup.sh installs it"
        ) from None
    if dist.version != version:
        raise PackageMissingError(f"{distribution} {dist.version} installed, expected {version}")
    found = Path(str(dist.locate_file(path)))
    if not found.exists():
        raise PackageMissingError(f"{found}: not in {distribution}=={version}")
    licence = dist.metadata.get("License-Expression") or dist.metadata.get("License") or ""
    return found, licence
