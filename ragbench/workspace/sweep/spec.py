"""Sweep specs: the YAML, its validation and the grid it expands to (pure but for reading files).

A sweep YAML names a notebook, fixed parameters and a grid::

    notebook: notebooks/01_niah_heatmap.ipynb
    parameters: {model: smollm2-135m-instruct}
    grid: {context_tokens: [1000, 2000], top_k: [2, 4]}
    output_dir: data/results/sweeps/niah      # optional

Errors name the file, line and key (``config.explain_validation_error``, shared with run
configs); parameters the notebook does not declare fail before anything runs. Loading a spec
hands every credential in its parameters to ``ragbench.secrets`` (``collect``), so whatever
quotes them later (an error, a log line) is masked; point ids never spell a credential out.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, model_validator

from ragbench import secrets
from ragbench.experiment.config.text import _line_of, explain_validation_error, located
from ragbench.io import InputFileError, dumps_canonical, load_yaml, read_text, yaml_problem
from ragbench.llm import BACKENDS
from ragbench.registry import did_you_mean

# papermill's notebook parameter types are only hints; these are the ones we can check cheaply.
_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


def _grid_values(values: list[Any]) -> list[Any]:
    """One grid entry: at least one value, none repeated (pydantic reports it at grid.<name>)."""
    if not values:
        raise ValueError("needs at least one value")
    keys = [dumps_canonical(v) for v in values]
    if len(set(keys)) != len(keys):
        raise ValueError(f"repeated values {values}")
    return values


GridValues = Annotated[list[Any], AfterValidator(_grid_values)]


# notebook parameters whose values are registry names (every ragbench notebook takes these)
REGISTERED = {"backend": BACKENDS}


class SweepSpecError(ValueError):
    """A bad sweep file or a parameter the notebook does not declare; names the file and key."""


class SweepSpec(BaseModel):
    """The sweep YAML. Unknown keys are errors, like every config in ragbench."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    notebook: str  # the parameterised notebook, relative to the YAML's folder or the cwd
    parameters: dict[str, Any] = {}  # fixed for every point
    grid: dict[str, GridValues] = {}  # name -> values; the sweep runs their cartesian product
    output_dir: str | None = None  # sweep folder; default data/results/sweeps/<yaml stem>
    output_param: str = "output_dir"  # notebook parameter that receives each point's folder
    # glob, inside a point's folder, of the tables it writes; ragbench.experiment.runner writes
    # <output_dir>/<name>-<hash>/results.parquet
    results: str = "**/results.parquet"
    # Jupyter kernel; default: the notebook's kernelspec (the project's ``ragbench`` kernel,
    # which ``make setup`` installs). "python3" is whatever interpreter Jupyter finds first.
    kernel: str | None = None

    @model_validator(mode="after")
    def _own_output(self) -> SweepSpec:
        """The sweep gives each point its own folder through ``output_param``: a spec that sets
        that parameter itself would send every point's run elsewhere (and find no results)."""
        for section in ("parameters", "grid"):
            if self.output_param in getattr(self, section):
                located((section, self.output_param), _refuse_output_param, self.output_param)
        return self

    @model_validator(mode="after")
    def _each_name_once(self) -> SweepSpec:
        """A name in both ``parameters`` and ``grid``: which value would a point get?"""
        for name in self.grid:
            if name in self.parameters:
                located(("grid", name), _refuse_both, name)
        return self

    @model_validator(mode="after")
    def _registered_names(self) -> SweepSpec:
        """Registry names among the values (``backend: fak``), checked before any point runs,
        with the valid ones: a typo fails in a second, not in every point's notebook."""
        for name, registry in REGISTERED.items():
            values = [("parameters", self.parameters[name])] if name in self.parameters else []
            values += [("grid", value) for value in self.grid.get(name, [])]
            for section, value in values:
                if isinstance(value, str):
                    located((section, name), registry.check, value)
        return self


def _refuse_both(name: str) -> None:
    raise ValueError(f"{name!r} is also set in parameters; keep each name in one place")


def _refuse_output_param(name: str) -> None:
    raise ValueError(
        f"the sweep sets {name!r} itself (each point's own folder, where it looks for "
        f"results); remove it here and put the sweep's folder in the top-level output_dir key"
    )


def load_spec(path: str | os.PathLike) -> SweepSpec:
    path = Path(path)
    try:
        text = read_text(path)
        raw = load_yaml(text)  # a repeated key, or aliases that expand too far: refused
    except FileNotFoundError:
        raise SweepSpecError(f"{path}: no such sweep file") from None
    except InputFileError as exc:
        raise SweepSpecError(str(exc)) from None
    except yaml.YAMLError as exc:  # one line: PyYAML's own message quotes the text
        line, problem = yaml_problem(exc)
        where = f"{path}:{line}" if line else str(path)
        raise SweepSpecError(f"{where}: invalid YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise SweepSpecError(f"{path}: expected a mapping with 'notebook', 'parameters', 'grid'")
    _collect_secrets(raw)  # before validating: its error messages may quote the values
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        message = explain_validation_error(exc, str(path), text, SweepSpec)
        raise SweepSpecError(_redact_explained(message)) from None


def _redact_explained(message: str) -> str:
    """``secrets.redact_text`` on the message part of each ``file:line: field: message`` line.
    The location stays out of it: ``grid.api_key: repeated values`` reads to the redactor as a
    credential named api_key with the value "repeated"."""
    lines = []
    for line in message.splitlines():
        parts = line.split(": ", 2)
        if len(parts) == 3:
            lines.append(f"{parts[0]}: {parts[1]}: {secrets.redact_text(parts[2])}")
        else:
            lines.append(secrets.redact_text(line))
    return "\n".join(lines)


def _collect_secrets(raw: dict[str, Any]) -> None:
    """Remember the credentials among the spec's values (``secrets.collect``). A grid value is
    collected under its parameter's name, so ``grid: {api_key: [a, b]}`` counts as credentials,
    as ``parameters: {api_key: a}`` does."""
    secrets.collect(raw)
    grid = raw.get("grid")
    if isinstance(grid, dict):
        for name, values in grid.items():
            for value in values if isinstance(values, list) else [values]:
                secrets.collect({name: value})


def expand_grid(spec: SweepSpec | dict[str, Any]) -> list[dict[str, Any]]:
    """Fixed parameters merged with each point of the grid, in YAML order (last key fastest)."""
    if not isinstance(spec, SweepSpec):
        spec = SweepSpec.model_validate(spec)
    names = list(spec.grid)
    return [
        {**spec.parameters, **dict(zip(names, values, strict=True))}
        for values in itertools.product(*(spec.grid[n] for n in names))
    ]


def point_id(params: dict[str, Any], varying: Sequence[str] | None = None) -> str:
    """A stable, filesystem-safe name: the varying parameters as a slug, plus a hash of all.

    The slug never spells a credential: the id names the point's folder and notebook and is
    printed. The hash still tells apart points that differ only in a credential."""
    digest = hashlib.sha256(dumps_canonical(params).encode()).hexdigest()[:8]
    names = list(varying) if varying is not None else sorted(params)
    parts = [
        f"{n}={_slug_value(_slug_safe(n, params[n]))}".replace(secrets.MASK, "xxx")
        for n in names
        if n in params
    ]
    # "top_k=4,retriever=dense": comma-separated, as a reader would write the point
    slug = re.sub(r"[^A-Za-z0-9=.,+_-]+", "-", ",".join(parts)).strip("-")[:80]
    return f"{slug}-{digest}" if slug else digest


_SLUG_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def _slug_safe(name: str, value: Any) -> Any:
    """The value a point id may show: credential-named parameters as ``***``, URLs without their
    userinfo or secret query values, well-known key shapes masked. Deliberately by fixed rules,
    not ``secrets.redact_text``: that one also masks the values this process happens to
    remember, and a folder name must not depend on which specs were loaded before."""
    if secrets.is_secret_name(name) and value not in (None, ""):
        return secrets.MASK
    if isinstance(value, str):
        value = _SLUG_URL.sub(lambda m: secrets.redact_url(m.group(0)), value)
        return secrets.SECRET_SHAPES.sub(secrets.MASK, value)
    return value


def _slug_value(value: Any) -> str:
    """A value as the id shows it: strings bare, lists ``64+128``, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return "+".join(_slug_value(v) for v in value)
    return json.dumps(value, sort_keys=True)


def spec_places(spec: SweepSpec, path: str | os.PathLike) -> dict[str, str]:
    """Each parameter's place in the spec file, as errors name it: ``file:line: grid.top_k``."""
    text = read_text(path)
    places = {}
    for name in [*spec.parameters, *spec.grid]:
        loc = ("grid" if name in spec.grid else "parameters", name)
        line = _line_of(text, loc)
        places[name] = f"{path}:{line}: {'.'.join(loc)}" if line else f"{path}: {'.'.join(loc)}"
    return places


def check_parameters(
    notebook: Path,
    names: Sequence[str],
    where: str,
    values: Sequence[tuple[str, Any]] = (),
    places: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Fail before any execution on a name the notebook does not declare, or a value whose
    type contradicts a simple declared type (int, float, str, bool); return the declarations.
    ``places``: where each name is written (``spec_places``); ``where`` for the rest."""
    import papermill

    place = (places or {}).get
    declared = papermill.inspect_notebook(str(notebook))
    if not declared:
        raise SweepSpecError(f"{where}: {notebook} has no cell tagged 'parameters'")
    problems = [
        f"{place(n, where)}: unknown parameter {n!r} for {notebook.name}; "
        f"{did_you_mean(n, declared)}"
        for n in names
        if n not in declared
    ]
    for name, value in values:
        expected = _SIMPLE_TYPES.get(str(declared.get(name, {}).get("inferred_type_name")))
        bad_bool = isinstance(value, bool) and expected is not None and bool not in expected
        if expected and (not isinstance(value, expected) or bad_bool):
            shown = secrets.redact({name: value})[name]
            kind = declared[name]["inferred_type_name"]
            # a grid over a list parameter lists lists: `chunk_sizes: [[64], [128]]`
            hint = f" (a grid over a {kind} parameter lists {kind}s)" if kind == "list" else ""
            problems.append(
                f"{place(name, where)}: parameter {name!r} is declared {kind}, got {shown!r}{hint}"
            )
    if problems:
        raise SweepSpecError("\n".join(problems))
    return declared
