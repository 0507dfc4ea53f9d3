"""`row_for`: the one place that compares a vLLM version with the table."""

from __future__ import annotations

from qwenquant.vllmcompat.table import ROWS
from qwenquant.vllmcompat.types import BUILDS, CompatRow, Hazard, RowMatch


def hazard(row: CompatRow, key: str) -> Hazard | None:
    """The hazard `key` of `row`, None when that release range does not have it."""
    return next((h for h in row.hazards if h.key == key), None)


def rows(build: str) -> tuple[CompatRow, ...]:
    """The rows of one build, oldest first."""
    if build not in BUILDS:
        raise ValueError(f"build {build!r} is not one of {BUILDS}")
    return tuple(r for r in ROWS if r.build == build)


def row_for(version: str | None, build: str) -> RowMatch:
    """The row of vLLM `version` (its `__version__`, local parts like "+cpu" ignored) for `build`.

    None (version unknown) or a version above every row: the newest row, with a warning; below every row:
    the oldest row, with a warning; not a PEP 440 version: the newest row, with a warning."""
    from packaging.version import InvalidVersion, Version

    table = rows(build)
    newest = table[-1]
    if version is None:
        return RowMatch(
            newest, None, False, f"vLLM version unknown: the guards of the newest {build} row ({newest.versions}) apply"
        )
    try:
        v = Version(Version(version).base_version)
    except InvalidVersion:
        return RowMatch(
            newest,
            version,
            False,
            f"vLLM reports version {version!r}, which is not a PEP 440 version: "
            f"the guards of the newest {build} row ({newest.versions}) apply",
        )
    for r in table:
        if Version(r.lowest) <= v and (r.highest is None or v <= Version(r.highest)):
            # The open-ended newest row was read in its lowest release: a later minor release is past the table.
            if r.highest is None and v.release[:2] > Version(r.lowest).release[:2]:
                break
            return RowMatch(r, version, False, None)
    if v < Version(table[0].lowest):  # below every row
        return RowMatch(
            table[0],
            version,
            False,
            f"vLLM {version} is older than every {build} row of qwenquant's version table "
            f"(oldest {table[0].versions}): its guards apply, untested",
            older_than_table=True,
        )
    return RowMatch(
        newest,
        version,
        True,
        f"vLLM {version} is newer than qwenquant's version table (newest {build} row "
        f"{newest.versions}): that row's guards apply; see docs/known-issues.md#vllm-versions",
    )


def read_range(build: str, field: str) -> str:
    """The releases of `build` whose rows have `field` true, as a specifier ">=LOW,<NEXT" (NEXT: the minor release
    after the last such row; for the open-ended newest row, the minor after the one read). The recipe layer's
    copies of these ranges (recipe/rules.py QUANTIZED_MTP_VLLM) are held equal to this by a test."""
    from packaging.version import Version

    hits = [r for r in rows(build) if getattr(r, field)]
    if not hits:
        return "<0"
    top = Version(hits[-1].highest or hits[-1].lowest).release
    return f">={hits[0].lowest},<{top[0]}.{top[1] + 1}"


def spec_tokens_problem(n: int | None, version: str | None, build: str) -> str | None:
    """None when `n` draft tokens are safe on vLLM `version` of `build` (the row's max_spec_tokens), else the
    sentence saying why not (recipe/speculative.py's, with the row's limit)."""
    from qwenquant.recipe.speculative import spec_tokens_problem as problem

    limit = row_for(version, build).row.max_spec_tokens
    return None if limit is None else problem(n, version, limit=limit)
