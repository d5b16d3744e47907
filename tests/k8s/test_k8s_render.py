"""k8s/render.py: the JSON6902 patcher and the kustomize subset it renders."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pytest
from k8s_checks import render_module

apply_json_patch = render_module.apply_json_patch
render = render_module.render
RenderError = render_module.RenderError

DOC = {
    "spec": {
        "containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}}, {"name": "b"}],
        "volumes": [{"name": "v"}],
    }
}


# --- JSON patch ------------------------------------------------------------------------------


def test_add_sets_a_key_and_decodes_pointer_escapes() -> None:
    out = apply_json_patch(DOC, [{"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu", "value": "1"}])
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1", "nvidia.com/gpu": "1"}


def test_tilde_zero_decodes_after_tilde_one() -> None:
    out = apply_json_patch({"a": {}}, [{"op": "add", "path": "/a/x~01", "value": 1}])
    assert out == {"a": {"x~1": 1}}


def test_add_inserts_into_and_appends_to_lists() -> None:
    out = apply_json_patch(DOC, [
        {"op": "add", "path": "/spec/volumes/0", "value": {"name": "first"}},
        {"op": "add", "path": "/spec/volumes/-", "value": {"name": "last"}},
    ])
    assert [v["name"] for v in out["spec"]["volumes"]] == ["first", "v", "last"]


def test_replace_and_remove() -> None:
    out = apply_json_patch(DOC, [
        {"op": "replace", "path": "/spec/containers/1/name", "value": "c"},
        {"op": "remove", "path": "/spec/volumes"},
    ])
    assert out["spec"] == {"containers": [DOC["spec"]["containers"][0], {"name": "c"}]}


def test_replace_the_whole_document() -> None:
    assert apply_json_patch(DOC, [{"op": "replace", "path": "", "value": {"x": 1}}]) == {"x": 1}


def test_patch_never_modifies_its_input() -> None:
    before = repr(DOC)
    apply_json_patch(DOC, [{"op": "remove", "path": "/spec/containers/0"}])
    with pytest.raises(RenderError):
        apply_json_patch(DOC, [{"op": "remove", "path": "/spec/volumes"}, {"op": "remove", "path": "/nope"}])
    assert repr(DOC) == before


def test_passing_test_op_is_a_no_op() -> None:
    assert apply_json_patch(DOC, [{"op": "test", "path": "/spec/containers/1/name", "value": "b"}]) == DOC


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"op": "test", "path": "/spec/containers/0/name", "value": "b"}, "test failed"),
        ({"op": "replace", "path": "/spec/missing", "value": 1}, "does not exist"),
        ({"op": "remove", "path": "/spec/containers/5"}, "out of range"),
        ({"op": "add", "path": "/spec/containers/3", "value": {}}, "out of range"),
        ({"op": "add", "path": "/spec/containers/01", "value": {}}, "bad array index"),
        ({"op": "add", "path": "/spec/missing/x", "value": 1}, "does not exist"),
        ({"op": "add", "path": "/spec/containers/0/name/x", "value": 1}, "scalar"),
        ({"op": "add", "path": "spec", "value": 1}, "must start with '/'"),
        ({"op": "add", "path": "/spec/x"}, "without 'value'"),
        ({"op": "move", "from": "/spec", "path": "/x"}, "unsupported JSON patch op"),
        ({"op": "remove", "path": ""}, "whole document"),
    ],
)
def test_bad_operations_raise(op: dict[str, object], message: str) -> None:
    with pytest.raises(RenderError, match=message):
        apply_json_patch(DOC, [op])


# --- kustomize subset ------------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


BASE = {
    "base/kustomization.yaml": """
        resources: [cm.yaml]
        secretGenerator:
          - name: s
            namespace: ns
            envs: [s.env]
        generatorOptions:
          disableNameSuffixHash: true
    """,
    "base/cm.yaml": """
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: cm, namespace: ns}
        data: {k: base}
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: cm, namespace: ns}
        spec: {replicas: 1}
    """,
    "base/s.env.example": "# comment\n\nTOKEN=a=b\n",
}


def test_overlay_patches_only_its_target(tmp_path: Path) -> None:
    _write(tmp_path, {**BASE,
        "overlay/kustomization.yaml": """
            resources: [../base]
            patches:
              - path: p.yaml
                target: {version: v1, kind: ConfigMap, name: cm}
        """,
        "overlay/p.yaml": "- {op: replace, path: /data/k, value: overlay}\n",
    })
    docs = render(tmp_path / "overlay", example_secrets=True)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [("ConfigMap", "cm"), ("Deployment", "cm"), ("Secret", "s")]
    assert docs[0]["data"] == {"k": "overlay"}
    assert docs[1]["spec"] == {"replicas": 1}


def test_secret_generator_reads_env_files(tmp_path: Path) -> None:
    _write(tmp_path, {**BASE, "base/s.env": "TOKEN=real\n"})
    (secret,) = [d for d in render(tmp_path / "base") if d["kind"] == "Secret"]
    assert secret == {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns"},
                      "type": "Opaque", "data": {"TOKEN": base64.b64encode(b"real").decode()}}


def test_example_fallback_keeps_values_after_the_first_equals(tmp_path: Path) -> None:
    _write(tmp_path, BASE)
    (secret,) = [d for d in render(tmp_path / "base", example_secrets=True) if d["kind"] == "Secret"]
    assert base64.b64decode(secret["data"]["TOKEN"]) == b"a=b"
    with pytest.raises(RenderError, match="s.env is missing"):
        render(tmp_path / "base")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"overlay/kustomization.yaml": "resources: [../base]\nnamePrefix: x-\n"}, "unsupported kustomization keys"),
        ({"overlay/kustomization.yaml": "resources: [missing.yaml]\n"}, "does not exist"),
        ({"overlay/kustomization.yaml": "resources: [../base]\npatches:\n  - path: p.yaml\n    target: {kind: Service, name: cm}\n",
          "overlay/p.yaml": "[]\n"}, "matches no resource"),
        ({"overlay/kustomization.yaml": "resources: [../base]\npatches:\n  - path: p.yaml\n",
          "overlay/p.yaml": "[]\n"}, "exactly 'path' and 'target'"),
        ({"overlay/kustomization.yaml": "resources: [../base]\npatches:\n  - path: p.yaml\n    target: {kind: ConfigMap}\n",
          "overlay/p.yaml": "metadata: {name: cm}\n"}, "list of operations"),
        ({"overlay/kustomization.yaml": "resources: [../base]\npatches:\n  - path: p.yaml\n    target: {kind: ConfigMap, labelSelector: a=b}\n",
          "overlay/p.yaml": "[]\n"}, "selectors are not supported"),
        ({"overlay/kustomization.yaml": "resources: [../base]\npatches:\n  - path: p.yaml\n    target: {kind: ConfigMap}\n",
          "overlay/p.yaml": "- {op: test, path: /data/k, value: other}\n"}, "p.yaml: test failed"),
        ({"overlay/kustomization.yaml": "resources: [../base, ../base/cm.yaml]\n"}, "defined twice"),
        ({"overlay/kustomization.yaml": "resources: [bad.yaml]\n", "overlay/bad.yaml": "just: data\n"}, "apiVersion and kind"),
        ({"overlay/kustomization.yaml": "kind: Component\n"}, "kind must be Kustomization"),
        ({"overlay/kustomization.yaml": "secretGenerator:\n  - name: s\n    envs: [x.env]\n"}, "disableNameSuffixHash"),
    ],
)
def test_unsupported_or_broken_kustomizations_raise(tmp_path: Path, files: dict[str, str], message: str) -> None:
    _write(tmp_path, {**BASE, **files})
    with pytest.raises(RenderError, match=message):
        render(tmp_path / "overlay", example_secrets=True)


def test_cli_prints_a_yaml_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, BASE)
    assert render_module.main([str(tmp_path / "base"), "--example-secrets"]) == 0
    assert capsys.readouterr().out.count("kind: ") == 3
    assert render_module.main([str(tmp_path / "base")]) == 1
    assert "s.env is missing" in capsys.readouterr().err
