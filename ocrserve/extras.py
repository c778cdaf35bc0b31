"""Optional dependencies ("extras"): is one installed, checked before a command starts its work.

A command that needs an extra calls :func:`require` first, so a user without it gets one line
naming the extra and the ``pip install`` that brings it, not a traceback after minutes of work.

The extras are read from ocrserve's installed metadata: the ``Requires-Dist`` lines marked
``extra == "NAME"`` that packaging writes from pyproject.toml's ``[project.optional-dependencies]``
(core metadata 2.1+, PEP 566 / PEP 685), so this module keeps no list of its own to drift from
pyproject.toml. A requirement with extras of its own (``ray[data,client]``) is followed into the
requirements its distribution marks with those extras.
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement

#: The distribution whose extras these are.
DISTRIBUTION = "ocrserve"


class MissingExtra(RuntimeError):
    """An extra's requirements are not all met.

    Attributes:
        extra: the extra's name (``bench``, ``debug``, ...).
        unmet: one phrase per unmet requirement (``"matplotlib is not installed"``,
            ``"transformers 4.57.1 (needs >=5.13)"``).
        purpose: what needed it (``"ocrserve bench"``), the message's subject.
    """

    def __init__(self, extra: str, unmet: list[str], purpose: str):
        self.extra, self.unmet, self.purpose = extra, unmet, purpose
        super().__init__(f"{purpose} needs the {extra} extra ({'; '.join(unmet)}): pip install 'ocrserve[{extra}]'")


def require(extra: str, purpose: str) -> None:
    """Raise :class:`MissingExtra` unless every requirement of ``extra`` is installed.

    Args:
        extra: an extra of ocrserve (``[project.optional-dependencies]``).
        purpose: what needs it, for the message (``"ocrserve bench"``, ``"--plot"``).

    Raises:
        MissingExtra: a requirement is not installed, or at a version outside its specifier.
        ValueError: ``extra`` is not an extra of the installed ocrserve.
    """
    unmet = unmet_requirements(extra)
    if unmet:
        raise MissingExtra(extra, unmet, purpose)


def unmet_requirements(extra: str) -> list[str]:
    """One phrase per requirement of ``extra`` that is not met here, in metadata order; ``[]``
    where all are, or where ocrserve runs from a source tree without installed metadata (its
    imports then fail as Python's own).

    Raises:
        ValueError: the installed ocrserve has no extra of that name.
    """
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return []
    if extra not in (dist.metadata.get_all("Provides-Extra") or []):
        raise ValueError(f"ocrserve has no extra {extra!r}")
    unmet: list[str] = []
    for requirement in _requirements(dist, extra):
        unmet += _unmet(requirement, seen=set())
    return list(dict.fromkeys(unmet))


def _requirements(dist: metadata.Distribution, extra: str) -> list[Requirement]:
    """``dist``'s requirements that apply with ``extra`` (and not without it) on this platform."""
    found = []
    for line in dist.requires or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if marker is not None and marker.evaluate({"extra": extra}) and not marker.evaluate({"extra": ""}):
            found.append(requirement)
    return found


def _unmet(requirement: Requirement, seen: set[str]) -> list[str]:
    """Why ``requirement`` (and what its own extras pull in) is not met; ``[]`` when it is."""
    try:
        dist = metadata.distribution(requirement.name)
    except metadata.PackageNotFoundError:
        return [f"{requirement.name} is not installed"]
    version = dist.version
    if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
        return [f"{requirement.name} {version} (needs {requirement.specifier})"]
    unmet = []
    for extra in sorted(requirement.extras):
        if (key := f"{requirement.name}[{extra}]") in seen:
            continue
        seen.add(key)
        for inner in _requirements(dist, extra):
            unmet += _unmet(inner, seen)
    return unmet
