"""The suite's ``--dist loadgroup`` (Makefile) keeps each ``xdist_group`` on one worker, where
the group's tests share their module fixtures (one multi-process launch, one full run). Some
pytest / pytest-xdist pairs ignore the marks without a word (pytest 9.2 keeps node ids that
xdist 3.8 cannot rename): then every worker recomputes those fixtures."""

import pytest

pytestmark = pytest.mark.xdist_group("xdist_groups")


def test_loadgroup_groups_the_marked_tests(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run with --dist loadgroup")
    assert request.node.nodeid.endswith("@xdist_groups"), (
        f"--dist loadgroup left {request.node.nodeid} ungrouped: install the pytest and "
        f"pytest-xdist versions setup.cfg's test extra pins")
