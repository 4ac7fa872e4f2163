#!/usr/bin/env bash
# ansible-test sanity on this checkout, laid out as ansible_collections/sparkops/appliance in a
# temporary tree (ansible-test requires that path). The tree is a git repository so that
# ansible-test honours .gitignore (tests/output/ holds its venvs: pylint must not scan them).
# Usage: tests/sanity/run.sh [extra ansible-test sanity options, e.g. --test pylint]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# ansible-test bootstraps pip in its venvs from a script it downloads (unreachable here):
# provide the stand-in under the cache name it looks for.
pip_version=$("$python" - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
class P:  # the only attribute get_venv_packages reads
    version = None
print(get_venv_packages(P())['pip'])
PY
)
cache=~/.ansible/test/cache/get_pip_${pip_version//./_}.py
mkdir -p "$(dirname "$cache")"
cmp -s "$root/tests/sanity/get_pip_standin.py" "$cache" || cp "$root/tests/sanity/get_pip_standin.py" "$cache"

tree=$root/build/sanity/ansible_collections/sparkops/appliance
rm -rf "$root/build/sanity"
mkdir -p "$tree"
# Tracked files and new files git does not ignore; never the .collections link back to the root.
(cd "$root" && git ls-files -z --cached --others --exclude-standard) \
    | grep -zv '^\.collections/' \
    | (cd "$root" && xargs -0 cp --parents -P -t "$tree" 2>/dev/null || true)
cd "$tree"
git init -q && git add -A && git -c user.name=sanity -c user.email=sanity@localhost commit -qm sanity
exec ansible-test sanity --venv --python "$pyver" --color no "$@"
