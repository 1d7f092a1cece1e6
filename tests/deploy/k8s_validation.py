"""Kubernetes manifests validated offline, as the API server would admit them.

- Built-in kinds: kubernetes-validate against Kubernetes K8S_VERSION's OpenAPI schemas, strict
  (an unknown field is an error, as kubectl's default `--validate=strict` makes it).
- CRD kinds (InferencePool, HTTPRoute, Gateway, ServiceMonitor): the `openAPIV3Schema` of each
  served version of the CRDs shipped in deploy/k8s/crds/ (upstream files, crds/README.md),
  translated to JSON Schema draft 4 (what OpenAPI 3.0 schemas are) and made strict the same way.
- Object names and labels: the API server's own syntax rules (DNS-1123 subdomains, DNS-1035
  labels for Services, qualified label keys, label values), which no OpenAPI schema states.

Not checked: the CEL rules (`x-kubernetes-validations`) of the CRDs, which only a real API
server evaluates; and nothing here reaches a cluster.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
sys.path.insert(0, str(K8S))
from emit import load_all  # noqa: E402  (the generator's reader: one YAML dialect)

K8S_VERSION = "1.36.0"  # the Kubernetes API GAIE v1.6.0 builds against (k8s.io/api v0.36)
GENERATED = ("pods", "fleet", "monitoring", "inference-gateway", "smg", "trtllm-serve", "llm-d")
API_DIRS = GENERATED[:-1]  # Kubernetes objects (llm-d/ holds Helm values)
DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = re.compile(rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

Doc = dict[str, Any]


def manifest_files() -> list[Path]:
    """Every generated manifest (kustomization files are kustomize's, not API objects)."""
    return sorted(f for d in API_DIRS for f in (K8S / d).glob("*.yaml")
                  if f.name != "kustomization.yaml")


def docs_of(path: Path) -> list[Doc]:
    return load_all(path.read_text())


def to_json_schema(schema: Any) -> Any:
    """A Kubernetes structural schema as strict JSON Schema: `nullable` admits null,
    `x-kubernetes-int-or-string` admits both, and an object with `properties` admits no other
    field unless it says `x-kubernetes-preserve-unknown-fields`."""
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: to_json_schema(v) if k in ("items", "additionalProperties", "not") else v
           for k, v in schema.items() if k not in ("properties", "allOf", "anyOf", "oneOf")}
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = to_json_schema(schema[key])
    if "properties" in schema:
        out["properties"] = {k: to_json_schema(v) for k, v in schema["properties"].items()}
        if ("additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft4Validator]:
    """(apiVersion, kind) -> a validator, for every served version of every shipped CRD."""
    found = {}
    for path in sorted((K8S / "crds").glob("*.yaml")):
        for crd in docs_of(path):
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served"):
                    schema = to_json_schema(version["schema"]["openAPIV3Schema"])
                    found[(f"{group}/{version['name']}", kind)] = jsonschema.Draft4Validator(schema)
    return found


def meta_errors(doc: Doc) -> list[str]:
    meta = doc.get("metadata", {})
    name, errors = meta.get("name", ""), []
    rule = DNS1035_LABEL if doc.get("kind") == "Service" else DNS1123_SUBDOMAIN
    limit = 63 if doc.get("kind") == "Service" else 253
    if not (rule.fullmatch(name) and len(name) <= limit):
        errors.append(f"metadata.name {name!r} is not a valid {doc.get('kind')} name")
    labels = [meta.get("labels") or {}]
    template = (doc.get("spec") or {}).get("template")
    if isinstance(template, dict):
        labels.append(template.get("metadata", {}).get("labels") or {})
    for key, value in (kv for group in labels for kv in group.items()):
        prefix, _, short = key.rpartition("/")
        if (prefix and not DNS1123_SUBDOMAIN.fullmatch(prefix)) or not (
                LABEL_NAME.fullmatch(short) and len(short) <= 63):
            errors.append(f"label key {key!r} is not a qualified name")
        if not (isinstance(value, str) and LABEL_VALUE.fullmatch(value) and len(value) <= 63):
            errors.append(f"label {key}={value!r}: not a valid label value")
    return errors


def errors_of(doc: Doc) -> list[str]:
    """Why the API server would refuse `doc` ([] if it would admit it). A kind with no
    schema here is an error, never a silent pass."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    validator = crd_validators().get(key)
    if validator is not None:
        schema_errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                         for e in validator.iter_errors(doc)]
    else:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            schema_errors = []
        except kubernetes_validate.ValidationError as e:
            schema_errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"]
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            schema_errors = [e.message]
    return schema_errors + meta_errors(doc)
