"""Runs a module as if only some distributions (and what they require, recursively) were installed: a test of what
a package line in the docs must name, without building an environment.

    python tests/installed_only.py torch,numpy,loguru benchmarks.gpu_smoke --quick

Every other distribution's modules are invisible to imports (an import fails, ``importlib.util.find_spec`` answers
None), as where they are not installed. The standard library, the project's ``criteo_dlrm`` and ``benchmarks``,
and what an allowed distribution vendors (setuptools' ``jaraco``) stay importable. Processes the module starts run
without the limit.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata as metadata
import re
import runpy
import sys
import sysconfig

OWN = {"criteo_dlrm", "benchmarks", "tests"}


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: list[str]) -> set[str]:
    """The distributions ``names`` and everything they require (extras left out), as installed here."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = normalised(re.split(r"[<>=!~;\[ (]", todo.pop())[0].strip())
        if not name or name in seen:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        todo += [requirement for requirement in requires if "extra ==" not in requirement]
    return seen


class OnlyAllowed(importlib.machinery.PathFinder):
    """sys.path's finder, blind to the top-level modules that no allowed distribution installed."""

    modules: set[str] = set()
    roots: tuple[str, ...] = ()

    @classmethod
    def allow(cls, distributions: set[str]) -> None:
        by_module = metadata.packages_distributions()
        cls.modules = OWN | {m for m, ds in by_module.items() if any(normalised(d) in distributions for d in ds)}
        roots = {
            f"{file.locate().parent.resolve()}/"
            for name in distributions
            for file in metadata.distribution(name).files or []
            if len(file.parts) == 2 and file.parts[0] != ".." and not file.parts[0].endswith((".dist-info", ".data"))
        }
        base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
        cls.roots = (*roots, f"{base['stdlib']}/", f"{base['platstdlib']}/lib-dynload/")

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = super().find_spec(name, path, target)
        top = name.partition(".")[0]
        if spec is None or path is not None or top in sys.stdlib_module_names or top in cls.modules:
            return spec
        where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
        if where.startswith(cls.roots):
            return spec
        # What an allowed distribution vendors and puts on sys.path itself, found there even where another copy
        # stands earlier on sys.path.
        vendored = [entry for entry in sys.path if f"{entry}/".startswith(cls.roots)]
        return super().find_spec(name, vendored, target) if vendored else None


def main() -> None:
    allowed, module, *arguments = sys.argv[1:]
    OnlyAllowed.allow(closure(allowed.split(",")))
    sys.meta_path[:] = [OnlyAllowed if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
