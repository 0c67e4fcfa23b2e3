"""Where the grammar and templates live: inside the installed package, or at the repo top.

The wheel carries `grammar/` and `templates/` as `msgen/grammar` and `msgen/templates`
(hatch force-include). In a checkout or an editable install they stay at the top of
the repository, next to the `msgen/` package.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jinja2

_PACKAGE = Path(__file__).resolve().parent


@cache
def resource_dir(name: str) -> Path:
    """Return the folder `name` (`grammar` or `templates`) that ships with msgen."""
    installed = _PACKAGE / name
    if installed.is_dir():
        return installed
    # Development checkout or editable install: the folder sits at the repository top.
    # Only trust that when the parent really is msgen's repository, never some other
    # package's stray top-level folder in site-packages.
    repo = _PACKAGE.parent
    checkout = repo / name
    if checkout.is_dir() and (repo / "pyproject.toml").is_file():
        return checkout
    raise FileNotFoundError(
        f"msgen resource folder {name!r} is missing: looked in {installed} and {checkout}"
    )


@cache
def template(name: str) -> jinja2.Template:
    """A template of `templates/`, in the one jinja2 environment msgen renders with
    (imported here, when something is rendered, so that `msgen check` never loads it)."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(resource_dir("templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return environment.get_template(name)
