"""pydantic's validation errors read by key: each error's ``loc`` without the tags pydantic puts in
it for the members of a union (``constrained-int``, ``literal['auto']``, ``int``), and the messages
of a value every member of a union refused, as one sentence."""

from __future__ import annotations

import re

from pydantic import ValidationError

#: A union member's tag in a pydantic error's ``loc`` (``constrained-int``, ``literal['auto']``,
#: ``int``): not a key, so left out of the key a message names.
UNION_MEMBER = re.compile(r"^(int|float|str|bool|[a-z]+-[a-z-]+(\[.*\])?|[a-z]+\[.*\])$")


def errors_by_key(exc: ValidationError) -> dict[tuple[str, ...], list[dict]]:
    """``exc``'s errors grouped by the key path they concern (union-member tags left out), in the
    order pydantic reports them."""
    failed: dict[tuple[str, ...], list[dict]] = {}
    for err in exc.errors():
        parts = tuple(str(p) for p in err["loc"] if not UNION_MEMBER.match(str(p)))
        failed.setdefault(parts, []).append(err)
    return failed


def either(errs: list[dict]) -> str:
    """The messages of a value every member of a union refused, as one: ``Input should be greater
    than or equal to 1, or 'auto'``."""
    first, *rest = (err["msg"] for err in errs)
    return ", or ".join([first, *(msg.removeprefix("Input should be ") for msg in rest)])
