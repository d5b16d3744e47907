"""Render a kustomization the way ``kubectl apply -k`` does, for the subset of kustomize we use.

kubectl and kustomize are not installed where the tests run, so the tests render with this file.
It supports exactly what ``k8s/`` uses and refuses everything else, so a kustomization it renders
means the same to kustomize:

- ``resources``: YAML files (one or more documents) and directories holding a kustomization;
- ``patches``: JSON6902 patches (a YAML list of operations in a file) with a ``target`` selecting
  one or more resources by group, version, kind, name and namespace; operations ``add``,
  ``remove``, ``replace`` and ``test`` (RFC 6902, JSON pointers per RFC 6901);
- ``secretGenerator``: ``envs`` files (``KEY=VALUE`` lines) into Opaque Secrets;
- ``generatorOptions``: only ``disableNameSuffixHash: true`` (no name-reference rewriting here).

Stricter than kustomize on purpose: a patch whose target matches nothing is an error, as is a
resource defined twice.

Usage::

    python k8s/render.py k8s/overlays/rtx4090 [--example-secrets] > rendered.yaml

Raises:
    RenderError: for anything outside the supported subset, or a patch that does not apply.
"""

from __future__ import annotations

import argparse
import base64
import copy
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["RenderError", "apply_json_patch", "render", "main"]

SUPPORTED_KEYS = frozenset({"apiVersion", "kind", "resources", "patches", "secretGenerator", "generatorOptions"})
KUSTOMIZATION_FILE = "kustomization.yaml"
EXAMPLE_SUFFIX = ".example"


class RenderError(Exception):
    """A kustomization outside the supported subset, or a patch that does not apply."""


# --- JSON Patch (RFC 6902) -------------------------------------------------------------------


def _split_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise RenderError(f"JSON pointer must start with '/': {pointer!r}")
    # RFC 6901: ~1 is '/', ~0 is '~', decoded in that order.
    return [token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")]


def _list_index(container: list[Any], token: str, *, for_insert: bool) -> int:
    if for_insert and token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise RenderError(f"bad array index {token!r}")
    index = int(token)
    limit = len(container) if for_insert else len(container) - 1
    if index > limit:
        raise RenderError(f"array index {index} out of range (length {len(container)})")
    return index


def _resolve(doc: Any, tokens: list[str], pointer: str) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise RenderError(f"path {pointer!r} does not exist (no key {token!r})")
            node = node[token]
        elif isinstance(node, list):
            node = node[_list_index(node, token, for_insert=False)]
        else:
            raise RenderError(f"path {pointer!r} goes through a scalar")
    return node


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    name = op.get("op")
    pointer = op.get("path")
    if not isinstance(pointer, str):
        raise RenderError(f"operation without a string 'path': {op!r}")
    tokens = _split_pointer(pointer)

    if name == "test":
        if "value" not in op:
            raise RenderError(f"test without 'value': {op!r}")
        actual = _resolve(doc, tokens, pointer)
        if actual != op["value"]:
            raise RenderError(f"test failed at {pointer!r}: expected {op['value']!r}, found {actual!r}")
        return doc
    if name not in ("add", "remove", "replace"):
        raise RenderError(f"unsupported JSON patch op {name!r} (supported: add, remove, replace, test)")
    if name in ("add", "replace") and "value" not in op:
        raise RenderError(f"{name} without 'value': {op!r}")
    if not tokens:
        if name == "remove":
            raise RenderError("cannot remove the whole document")
        return copy.deepcopy(op["value"])

    parent = _resolve(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if name in ("remove", "replace") and last not in parent:
            raise RenderError(f"path {pointer!r} does not exist (no key {last!r})")
        if name == "remove":
            del parent[last]
        else:
            parent[last] = copy.deepcopy(op["value"])
    elif isinstance(parent, list):
        index = _list_index(parent, last, for_insert=name == "add")
        if name == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
        elif name == "remove":
            del parent[index]
        else:
            parent[index] = copy.deepcopy(op["value"])
    else:
        raise RenderError(f"path {pointer!r}: parent is a scalar")
    return doc


def apply_json_patch(doc: Any, ops: Iterable[dict[str, Any]]) -> Any:
    """Apply JSON6902 operations to a copy of ``doc``; atomic: ``doc`` is never modified.

    Args:
        doc: the resource (any JSON-like value).
        ops: operations, each a mapping with ``op``, ``path`` and (for add/replace/test) ``value``.

    Returns:
        The patched copy.

    Raises:
        RenderError: an unsupported op, a missing path, a bad index, or a failed ``test``.
    """
    result = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict):
            raise RenderError(f"a JSON patch operation must be a mapping, got {op!r}")
        result = _apply_op(result, op)
    return result


# --- kustomization ---------------------------------------------------------------------------


def _load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    try:
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    except yaml.YAMLError as exc:
        raise RenderError(f"{path}: invalid YAML: {exc}") from exc
    for doc in docs:
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            raise RenderError(f"{path}: every document needs apiVersion and kind")
    return docs


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def _matches(doc: dict[str, Any], target: dict[str, Any]) -> bool:
    group, version = _group_version(doc["apiVersion"])
    meta = doc.get("metadata", {})
    wanted = {
        "group": group,
        "version": version,
        "kind": doc["kind"],
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
    }
    unknown = set(target) - set(wanted)
    if unknown:
        raise RenderError(f"unsupported patch target fields {sorted(unknown)} (selectors are not supported)")
    return all(wanted[key] == value for key, value in target.items())


def _read_env_file(path: Path) -> dict[str, str]:
    data: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise RenderError(f"{path}:{number}: expected KEY=VALUE")
        data[key] = value
    return data


def _generate_secret(spec: dict[str, Any], root: Path, example_secrets: bool) -> dict[str, Any]:
    unknown = set(spec) - {"name", "namespace", "envs", "type"}
    if unknown:
        raise RenderError(f"{root}: unsupported secretGenerator fields {sorted(unknown)}")
    data: dict[str, str] = {}
    for env in spec.get("envs", []):
        path = root / env
        if not path.exists() and example_secrets:
            path = path.with_name(path.name + EXAMPLE_SUFFIX)
        if not path.exists():
            raise RenderError(f"{root / env} is missing: copy {env}{EXAMPLE_SUFFIX} and fill it in")
        for key, value in _read_env_file(path).items():
            data[key] = base64.b64encode(value.encode()).decode()
    metadata: dict[str, Any] = {"name": spec["name"]}
    if "namespace" in spec:
        metadata["namespace"] = spec["namespace"]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata,
            "type": spec.get("type", "Opaque"), "data": data}


def _resource_id(doc: dict[str, Any]) -> tuple[str, str, str | None, str | None]:
    meta = doc.get("metadata", {})
    return doc["apiVersion"], doc["kind"], meta.get("namespace"), meta.get("name")


def render(directory: str | Path, *, example_secrets: bool = False) -> list[dict[str, Any]]:
    """Render the kustomization in ``directory``.

    Args:
        directory: a folder holding ``kustomization.yaml``.
        example_secrets: when a secretGenerator env file is missing, read ``<file>.example``
            instead (tests and previews; a real deploy must provide the file).

    Returns:
        The resources, in kustomization order (bases first, generated Secrets last).

    Raises:
        RenderError: see the module docstring.
    """
    root = Path(directory)
    kfile = root / KUSTOMIZATION_FILE
    if not kfile.is_file():
        raise RenderError(f"{root}: no {KUSTOMIZATION_FILE}")
    kustomization = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise RenderError(f"{kfile}: unsupported kustomization keys {sorted(unknown)}")
    if kustomization.get("kind", "Kustomization") != "Kustomization":
        raise RenderError(f"{kfile}: kind must be Kustomization")

    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir():
            docs.extend(render(path, example_secrets=example_secrets))
        elif path.is_file():
            docs.extend(_load_yaml_documents(path))
        else:
            raise RenderError(f"{kfile}: resource {entry!r} does not exist")

    generators = kustomization.get("secretGenerator", [])
    options = kustomization.get("generatorOptions", {})
    if generators and options != {"disableNameSuffixHash": True}:
        raise RenderError(f"{kfile}: secretGenerator needs generatorOptions.disableNameSuffixHash: true")
    docs.extend(_generate_secret(spec, root, example_secrets) for spec in generators)

    for patch in kustomization.get("patches", []):
        if set(patch) != {"path", "target"}:
            raise RenderError(f"{kfile}: patches need exactly 'path' and 'target' (JSON6902), got {sorted(patch)}")
        ops = yaml.safe_load((root / patch["path"]).read_text())
        if not isinstance(ops, list):
            raise RenderError(f"{root / patch['path']}: a JSON6902 patch is a list of operations")
        hits = [i for i, doc in enumerate(docs) if _matches(doc, patch["target"])]
        if not hits:
            raise RenderError(f"{kfile}: patch {patch['path']} matches no resource ({patch['target']})")
        for i in hits:
            try:
                docs[i] = apply_json_patch(docs[i], ops)
            except RenderError as exc:
                raise RenderError(f"{root / patch['path']}: {exc}") from exc

    seen: set[tuple[str, str, str | None, str | None]] = set()
    for doc in docs:
        rid = _resource_id(doc)
        if rid in seen:
            raise RenderError(f"{kfile}: resource defined twice: {rid}")
        seen.add(rid)
    return docs


def main(argv: list[str] | None = None) -> int:
    """Print the rendered kustomization as a YAML stream."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--example-secrets", action="store_true",
                        help="use secrets/*.env.example where the real env file is missing")
    args = parser.parse_args(argv)
    try:
        docs = render(args.directory, example_secrets=args.example_secrets)
    except RenderError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 1
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
