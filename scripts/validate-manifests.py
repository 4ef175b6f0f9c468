#!/usr/bin/env python3
"""Validates rendered manifests: `kubectl kustomize deploy/` output, or a `helm template` render.

    kubectl kustomize deploy/ > rendered.yaml && python3 scripts/validate-manifests.py rendered.yaml
    helm template ... > r.yaml && python3 scripts/validate-manifests.py r.yaml --expect DaemonSet,Service

--expect names the kinds the render must contain (default: everything `deploy/` renders).

- Core kinds: PyPI kubernetes-validate, strict (unknown fields rejected), against the oldest and the
  newest Kubernetes schema it ships.
- ServiceMonitor / PrometheusRule (Prometheus Operator CRDs, for which kubernetes-validate has no
  schema): a minimal JSON schema of our own covering every field deploy/ uses, additionalProperties
  false; the PrometheusRule's spec is also checked by `promtool check rules` when promtool exists.
Exits 1 naming each document that fails.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import kubernetes_validate
import yaml

STR = {"type": "string"}
LABELS = {"type": "object", "additionalProperties": STR}
METADATA = {"type": "object", "required": ["name"], "additionalProperties": False,
            "properties": {"name": STR, "namespace": STR, "labels": LABELS, "annotations": LABELS}}
DURATION = {"type": "string", "pattern": r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"}

RELABELINGS = {"type": "array", "items": {
    "type": "object", "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": STR}, "targetLabel": STR,
        "regex": STR, "replacement": STR, "separator": STR, "modulus": {"type": "integer"},
        "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop",
                            "labelkeep", "hashmod", "lowercase", "uppercase", "keepequal", "dropequal"]}}}}
SECRET_KEY = {"type": "object", "required": ["name", "key"], "additionalProperties": False,
              "properties": {"name": STR, "key": STR, "optional": {"type": "boolean"}}}
SECRET_OR_CONFIGMAP = {"type": "object", "additionalProperties": False,
                       "properties": {"secret": SECRET_KEY, "configMap": SECRET_KEY}}
TLS_CONFIG = {"type": "object", "additionalProperties": False,
              "properties": {"insecureSkipVerify": {"type": "boolean"}, "serverName": STR,
                             "ca": SECRET_OR_CONFIGMAP, "cert": SECRET_OR_CONFIGMAP, "keySecret": SECRET_KEY}}
BASIC_AUTH = {"type": "object", "additionalProperties": False,
              "properties": {"username": SECRET_KEY, "password": SECRET_KEY}}

SERVICE_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": METADATA,
        "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                 "properties": {
                     "selector": {"type": "object", "additionalProperties": False,
                                  "properties": {"matchLabels": LABELS}},
                     "jobLabel": STR,
                     "endpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["port"], "additionalProperties": False,
                         "properties": {
                             "port": STR, "path": STR, "scheme": {"enum": ["http", "https"]},
                             "interval": DURATION, "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"},
                             "relabelings": RELABELINGS, "metricRelabelings": RELABELINGS,
                             "tlsConfig": TLS_CONFIG, "basicAuth": BASIC_AUTH}}},
                     "namespaceSelector": {"type": "object", "additionalProperties": False,
                                           "properties": {"any": {"type": "boolean"},
                                                          "matchNames": {"type": "array", "items": STR}}}}}}}

RULE = {"type": "object", "additionalProperties": False, "required": ["expr"],
        "properties": {"alert": STR, "record": STR, "expr": STR, "for": DURATION,
                       "labels": LABELS, "annotations": LABELS}}
PROMETHEUS_RULE = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": {"type": "object", "required": ["groups"], "additionalProperties": False,
                 "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                     "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                     "properties": {"name": STR, "interval": DURATION,
                                    "rules": {"type": "array", "minItems": 1, "items": RULE}}}}}}}}

CRDS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def schema_versions():
    base = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
    versions = sorted({d.split("-")[0].lstrip("v") for d in os.listdir(base) if d.startswith("v")},
                      key=lambda v: tuple(int(x) for x in v.split(".")))
    return [versions[0], versions[-1]]


DEPLOY_KINDS = {"Namespace", "ServiceAccount", "ConfigMap", "Service", "DaemonSet", "ServiceMonitor", "PrometheusRule"}


def main(path, expected=DEPLOY_KINDS):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    failures = []
    versions = schema_versions()
    kinds = []
    for doc in docs:
        kind = doc.get("kind", "?")
        name = f'{kind}/{doc.get("metadata", {}).get("name", "?")}'
        kinds.append(kind)
        if kind in CRDS:
            try:
                jsonschema.validate(doc, CRDS[kind])
                print(f"ok   {name} (own minimal {kind} schema)")
            except jsonschema.ValidationError as e:
                failures.append(f"{name}: {e.message} at {'/'.join(map(str, e.absolute_path))}")
            if kind == "PrometheusRule" and shutil.which("promtool"):
                with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as tmp:
                    yaml.safe_dump(doc["spec"], tmp)
                r = subprocess.run(["promtool", "check", "rules", tmp.name], capture_output=True, text=True)
                os.unlink(tmp.name)
                if r.returncode != 0:
                    failures.append(f"{name}: promtool check rules: {r.stdout}{r.stderr}")
                else:
                    print(f"ok   {name} (promtool check rules)")
            continue
        for v in versions:
            try:
                kubernetes_validate.validate(doc, v, strict=True)
                print(f"ok   {name} (Kubernetes {v}, strict)")
            except kubernetes_validate.ValidationError as e:
                failures.append(f"{name}: Kubernetes {v}: {e.message} at {'/'.join(map(str, e.path))}")
            except kubernetes_validate.SchemaNotFoundError as e:
                failures.append(f"{name}: no schema for it in Kubernetes {v}: {e}")
    missing = expected - set(kinds)
    if missing:
        failures.append(f"rendered output lacks {sorted(missing)}")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    kinds = DEPLOY_KINDS
    if len(args) == 3 and args[1] == "--expect":
        kinds = {k for k in args[2].split(",") if k}
        args = args[:1]
    if len(args) != 1:
        sys.exit("usage: validate-manifests.py RENDERED.yaml [--expect KIND,KIND,...]")
    sys.exit(main(args[0], kinds))
