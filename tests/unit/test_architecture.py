"""The import contracts in pyproject.toml, as import-linter checks them: layers flow one way (app ->
orchestration -> runtime -> leaves, siblings independent, so no package imports another in a circle),
no torch in the pure packages, and every package entered through its face (tools/import_faces.py).
``lint-imports`` in the checkout runs the same check."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

from tools.import_faces import PublicFacesContract

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    # import-linter configures logging with dictConfig, which disables every logger that exists by then
    # ("synapse" among them, once any test logged): later tests in this process would see no record
    loggers = [x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)]
    disabled = {logger: logger.disabled for logger in loggers}
    try:
        exit_code = lint_imports(config_filename=os.fspath(REPO / "pyproject.toml"), no_cache=True, no_logo=True)
    finally:
        for logger, was in disabled.items():
            logger.disabled = was
    report = capsys.readouterr().out
    assert exit_code == 0, report[-4000:]
    assert report.count("KEPT") == 3 and "BROKEN" not in report


def _graph(*imports: tuple[str, str]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for module in ("app", "app.data", "app.data.jpeg", "app.data.base", "app.engine", "app.engine.loop"):
        graph.add_module(module)
    for importer, imported in imports:
        graph.add_import(importer=importer, imported=imported, line_number=3, line_contents="import")
    return graph


def _check(graph: grimp.ImportGraph):
    contract = PublicFacesContract(name="faces", session_options={}, contract_options={"containers": ["app"]})
    return contract.check(graph, verbose=False)


def test_the_face_contract_refuses_an_import_behind_another_package_s_face():
    check = _check(_graph(("app.engine.loop", "app.data.jpeg")))
    assert not check.kept
    assert check.metadata["behind"] == [("app.engine.loop", "app.data.jpeg", (3,))]


def test_the_face_contract_allows_the_face_and_a_package_s_own_modules():
    check = _check(_graph(("app.engine.loop", "app.data"), ("app.data", "app.data.jpeg"),
                          ("app.data.base", "app.data.jpeg")))
    assert check.kept
