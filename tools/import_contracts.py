"""An import-linter contract the built-in ones lack: no package in an import cycle with its
own submodules.

`acyclic_siblings` looks for cycles between the children of a package; the package's own
`__init__` is not one of them, so a package that imports its submodule, which imports the
package back (`app.cli` -> `app.cli.workers` -> `app.cli`), passes it. Such a cycle makes
the import order matter (whichever is imported first sees the other half-built) and hides
which module the shared code belongs to. This contract finds, for every package under
`ancestors` (the ancestors included), each submodule the package imports from which a
chain of imports leads back to the package itself.

Registered in pyproject.toml's `[tool.importlinter]` as `contract_types`; `lint-imports`
puts the working directory on `sys.path`, so it runs from the repository root.
"""

from __future__ import annotations

from typing import cast

import grimp
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain.helpers import module_expressions_to_modules
from importlinter.domain.imports import ModuleExpression


class PackageCyclesContract(Contract):
    """Options: `ancestors`, the packages whose descendants (and themselves) are checked."""

    ancestors = fields.SetField(subfield=fields.ModuleExpressionField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        # A field's value is its parsed option (the class attribute is the field itself).
        ancestors = cast(set[ModuleExpression], self.ancestors)
        roots = module_expressions_to_modules(graph, ancestors, raise_if_unmatched=True)
        cycles: list[tuple[str, ...]] = []
        for root in sorted(module.name for module in roots):
            for package in sorted({root} | graph.find_descendants(root)):
                cycles += _cycles_through(graph, package)
                output.verbose_print(verbose, f"Searched {package} and its submodules.")
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"{cycle[0]} is in an import cycle with its own submodule:")
            output.print_error("    " + " -> ".join(cycle))
            output.new_line()


def _cycles_through(graph: grimp.ImportGraph, package: str) -> list[tuple[str, ...]]:
    """Each cycle that leaves `package` for one of its submodules and comes back to it,
    as the shortest chain of modules from the package back to itself."""
    if not graph.find_children(package):
        return []
    descendants = graph.find_descendants(package)
    cycles = []
    for imported in sorted(graph.find_modules_directly_imported_by(package) & descendants):
        chain = graph.find_shortest_chain(importer=imported, imported=package)
        if chain:
            cycles.append((package, *chain))
    return cycles
