"""mcpg.results: the recorded results are found where a clone keeps them, fetched at the commit
the library was installed from, and otherwise named in one sentence."""

import subprocess

import pytest

from mcpg import results


def git(*args, cwd):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c",
                           "commit.gpgsign=false", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """A working directory with no data/results above it, and a library installed from nowhere."""
    monkeypatch.delenv("MCPG_RESULTS", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(results, "__file__", str(tmp_path / "site" / "mcpg" / "results.py"))
    monkeypatch.setattr(results, "installed_from", lambda: None)
    return work


@pytest.fixture
def origin(tmp_path):
    """A repository with data/results at two commits: (address, first commit, second commit)."""
    repo = tmp_path / "origin"
    (repo / "data" / "results" / "ch09").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "src" / "code.py").write_text("x = 1\n")
    (repo / "data" / "results" / "ch09" / "budget.json").write_text('{"commit": 1}')
    git("init", "--quiet", cwd=repo)
    git("add", "--all", cwd=repo)
    git("commit", "--quiet", "-m", "first", cwd=repo)
    first = git("rev-parse", "HEAD", cwd=repo)
    (repo / "data" / "results" / "ch09" / "budget.json").write_text('{"commit": 2}')
    git("commit", "--quiet", "-am", "second", cwd=repo)
    return "file://" + repo.as_posix(), first, git("rev-parse", "HEAD", cwd=repo)


def test_found_above_the_working_directory(nowhere, monkeypatch):
    deep = nowhere / "book" / "sub"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    with pytest.raises(results.ResultsNotFound):
        results.results_dir()
    (nowhere / "data" / "results").mkdir(parents=True)
    assert results.results_dir() == nowhere / "data" / "results"


def test_the_environment_variable_wins_and_must_name_a_folder(nowhere, monkeypatch, tmp_path):
    (nowhere / "data" / "results").mkdir(parents=True)
    monkeypatch.setenv("MCPG_RESULTS", str(tmp_path))
    assert results.results_dir() == tmp_path
    monkeypatch.setenv("MCPG_RESULTS", str(tmp_path / "missing"))
    with pytest.raises(results.ResultsNotFound, match="not a folder"):
        results.results_dir()


def test_found_in_the_source_tree_the_library_was_installed_from(nowhere, monkeypatch, tmp_path):
    tree = tmp_path / "clone"
    (tree / "data" / "results").mkdir(parents=True)
    monkeypatch.setattr(results, "installed_from",
                        lambda: {"url": tree.as_uri(), "dir_info": {"editable": True}})
    assert results.results_dir() == tree / "data" / "results"
    monkeypatch.setattr(results, "installed_from", lambda: None)  # src/ on the path: beside mcpg/
    monkeypatch.setattr(results, "__file__", str(tree / "src" / "mcpg" / "results.py"))
    assert results.results_dir() == tree / "data" / "results"


def test_missing_results_give_one_sentence(nowhere):
    with pytest.raises(results.ResultsNotFound) as err:
        results.results_dir()
    message = str(err.value)
    assert str(nowhere) in message and "data/results" in message and "MCPG_RESULTS" in message
    assert message.endswith(".") and message.count(". ") == 0  # one sentence
    assert err.value._render_traceback_() == [f"ResultsNotFound: {message}"]  # no traceback
    assert not (nowhere / results.FETCHED).exists()


def test_fetched_at_the_installed_commit_only_the_results(nowhere, monkeypatch, origin):
    url, first, second = origin
    monkeypatch.setattr(results, "installed_from", lambda: {
        "url": url, "vcs_info": {"vcs": "git", "commit_id": first, "requested_revision": "main"}})
    got = results.results_dir()
    assert got == nowhere / results.FETCHED / first[:12] / "data" / "results"
    assert (got / "ch09" / "budget.json").read_text() == '{"commit": 1}'  # the installed commit's
    assert not (got.parents[1] / "src").exists()  # that folder alone
    calls = []
    monkeypatch.setattr(results, "_git", lambda *a, **k: calls.append(a))
    assert results.results_dir() == got and calls == []  # fetched once, then reused


def test_fetch_false_and_a_failed_fetch_say_so(nowhere, monkeypatch, origin):
    url, first, _ = origin
    source = {"url": url + "-missing", "vcs_info": {"vcs": "git", "commit_id": first}}
    monkeypatch.setattr(results, "installed_from", lambda: source)
    with pytest.raises(results.ResultsNotFound) as err:
        results.results_dir()
    assert f"fetching them from {url}-missing at commit {first[:12]} failed" in str(err.value)
    with pytest.raises(results.ResultsNotFound) as err:
        results.results_dir(fetch=False)
    assert "fetching" not in str(err.value)
