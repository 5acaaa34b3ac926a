"""Shared fixtures, and the hypothesis profiles of the test suite.

Two profiles:

- ``ci`` (the default, what ``python -m pytest`` runs): derandomised. Every property-based
  test draws the same examples on every run and every machine (``derandomize=True``), and
  nothing is read from or written to an example database, so a run cannot start failing
  because an earlier run stored an example. No deadlines: timings on a shared CPU are noise.
- ``thorough`` (for local runs, ``python -m pytest --hypothesis-profile=thorough``): fresh
  random examples on every run, ten times as many per test as the test asks for, failing
  examples kept in ``.hypothesis/`` and replayed first next time. Use it after changing a
  module, and run it a few times; a failure it finds prints a ``@reproduce_failure`` line.

Both are registered here, before the test modules are imported, so that the ``settings(...)``
objects the modules create inherit the chosen profile's values.

Known third-party warnings (the command line's, and one from TRL) are filtered by message,
category and module in :func:`pytest_configure`; every other warning is reported.
"""

from pathlib import Path

import pytest
from hypothesis import settings

THOROUGH_FACTOR = 10  # max_examples multiplier of the thorough profile

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("thorough", derandomize=False, deadline=None, print_blob=True)
settings.load_profile("ci")  # --hypothesis-profile=NAME, handled by hypothesis' plugin later, overrides this


def pytest_configure(config):
    """Hide the known third-party warnings, and only those, as the command line does.

    Each is matched by message, category and module (see ``KNOWN_WARNINGS`` in
    ``mcpg.grpo.__main__`` for why each says nothing about our code); any other warning is
    still reported.
    """
    from mcpg.grpo.__main__ import KNOWN_WARNINGS

    known = KNOWN_WARNINGS + [
        # TRL's GRPOConfig sets transformers' deprecated `gradient_checkpointing` argument;
        # only the test that compares our loss with TRL's builds one.
        dict(message=r"`gradient_checkpointing` is deprecated", category=FutureWarning,
             module=r"transformers\.training_args"),
    ]
    for w in known:
        line = f"ignore:{w['message']}:{w['category'].__name__}:{w['module']}"
        config.addinivalue_line("filterwarnings", line)


def pytest_collection_modifyitems(config, items):
    """Under ``thorough``, run each property-based test with THOROUGH_FACTOR times its examples.

    Most tests fix ``max_examples`` in their own ``settings(...)``, which a profile cannot
    override; so the test's settings object, which hypothesis reads from the test function
    when the test runs, is replaced by a child with the larger count.
    """
    if settings.get_current_profile_name() != "thorough":
        return
    for item in items:
        fn = getattr(item, "function", None)
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is not None and hasattr(fn, "hypothesis"):
            more = settings(own, max_examples=own.max_examples * THOROUGH_FACTOR)
            fn._hypothesis_internal_use_settings = more


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


GSM8K_FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"
"""The tests' small GSM8K split (a few problems in GSM8K's own format)."""


@pytest.fixture
def gsm8k_fixture(monkeypatch):
    """``MCPG_GSM8K_DIR`` set to :data:`GSM8K_FIXTURE`, so the engine reads no real data."""
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(GSM8K_FIXTURE))
    return GSM8K_FIXTURE
