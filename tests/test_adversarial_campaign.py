"""Every case of the issue 31 campaign (``tests/campaign/issue31_campaign.py``) as a test: bad inputs and faults end
as a named error, a recorded failure or a correct result -- the outcome the case allows -- never a traceback, a
silently wrong result, a hang or a lost file.

The oracle is the campaign's own (:func:`issue31_campaign.run_case`): it checks the exit status, the one-line
``fednet:`` message and the argument it names, the output against the case's own check (secret seed kept out of the
public files, energy and latency floors present, Markdown/LaTeX/CSV labels intact), files planted beside the output
and debris left behind.  The cases that start a Dask cluster are marked ``slow`` (about 30-60 s each).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "campaign"))

import issue31_campaign as campaign  # noqa: E402

CASES = campaign.all_cases()


def test_the_campaign_has_at_least_100_cases_with_unique_names() -> None:
    names = [c.name for c in CASES]
    assert len(names) >= 100
    assert len(set(names)) == len(names)


@pytest.fixture(scope="module")
def root():
    with tempfile.TemporaryDirectory(prefix="fednet-campaign31-") as d:
        yield Path(d)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else [])
                                  for c in CASES])
def test_case(case: campaign.Case, root: Path) -> None:
    from fednet.protocol import registry

    saved = dict(registry._REGISTRY)
    try:
        verdict, detail = campaign.run_case(case, root)
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)
    assert verdict in case.expect, f"{case.name}: {verdict}: {detail}"
