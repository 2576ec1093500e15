"""An import-linter contract type: every package of a container is entered through its face.

A package's ``__init__`` names what the package offers (``__all__``); a module outside the
package that imports one of its modules directly (``synapse.data.jpeg`` instead of
``synapse.data``) reaches behind that face, and the package can no longer move its insides.
The contract covers every package in the container, present and future, so a new package
needs no new contract. Registered in pyproject.toml (``contract_types``); ``lint-imports``
finds this module because it puts the working directory on ``sys.path``.
"""
from __future__ import annotations

import grimp
from importlinter import Contract, ContractCheck, fields, output


class PublicFacesContract(Contract):
    """``containers``: the packages whose subpackages must be imported only through their faces."""

    type_name = "public_faces"

    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        behind: list[tuple[str, str, tuple[int | None, ...]]] = []
        for container in self.containers:  # type: ignore[attr-defined]
            for package in sorted(graph.find_children(container)):
                insides = graph.find_descendants(package)
                for inside in sorted(insides):
                    for importer in sorted(graph.find_modules_that_directly_import(inside)):
                        if importer == package or importer in insides:
                            continue
                        lines = tuple(d["line_number"] for d in graph.get_import_details(
                            importer=importer, imported=inside))
                        behind.append((importer, inside, lines))
        return ContractCheck(kept=not behind, warnings=[], metadata={"behind": behind})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, inside, lines in check.metadata["behind"]:
            face = ".".join(inside.split(".")[:2])
            output.print_error(f"- {importer} -> {inside} (l.{', '.join(map(str, lines))}): "
                               f"import it from {face}, and add it to {face}'s __all__ if it is missing",
                               bold=False)
            output.new_line()
