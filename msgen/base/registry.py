"""Registries found by discovery: every class of a package's modules that subclasses a
base and declares a key (the op library by op name, a backend's emitters by op kind),
so that adding one is adding its module."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable


def discover(package: str, path: Iterable[str], base: type, key: str) -> dict:
    """{class.key: instance} over the public `base` subclasses defined in the modules of
    `package` (at `path`) that set `key` themselves, in the order of the modules' names
    and, within a module, of definition."""
    found = {}
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        module = importlib.import_module(f"{package}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, base)
                and value.__module__ == module.__name__
                and key in vars(value)
            ):
                found[getattr(value, key)] = value()
    return found
