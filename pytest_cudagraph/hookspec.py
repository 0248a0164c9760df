"""The hooks pytest-cudagraph declares for other plugins (plugin.py adds them to pytest's).

A plugin extends the results through a hook, not a call into the plugin's state: it returns
its sections, and the plugin reads every plugin's at the session's start, in one place
(``results.declared_sections``).
"""

from __future__ import annotations

import pytest

from pytest_cudagraph.sections import Section


@pytest.hookspec
def pytest_cudagraph_results_sections(config: pytest.Config) -> list[Section]:
    """The sections this plugin adds to the session's results (``sections.Section``: a name,
    ``data(records)`` and ``lines(data)``), in the order they come; ``[]`` for none.

    Called once, when the session starts, after every plugin's ``pytest_configure``; each
    section's ``data`` and ``lines`` run at the session's end. A plugin that may run without
    pytest-cudagraph marks its implementation ``@pytest.hookimpl(optionalhook=True)``.
    """
    raise NotImplementedError  # a specification: pluggy calls the implementations, never this
