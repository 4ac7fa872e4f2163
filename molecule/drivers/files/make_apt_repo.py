# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build a flat apt repository of stand-in NVIDIA packages for the drivers scenario (stdlib + dpkg-deb).

The packages carry the names, versions and dependencies NVIDIA's repositories use for Ubuntu 24.04
(nvidia-driver-580-open from the CUDA repository, the four NVIDIA Container Toolkit packages from
libnvidia-container's), so apt and dpkg resolve, install, upgrade and downgrade them for real; their
contents are only a marker file (there is no GPU here), and nvidia-container-runtime is a stand-in
that refuses to run containers.

Usage: python3 make_apt_repo.py REPO_DIR NAME=VERSION [NAME=VERSION ...]
Adds the packages given (or keeps them when already built) and rewrites Packages and Release.
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import time

DEPENDS = {
    "nvidia-container-toolkit": "nvidia-container-toolkit-base (= {v}), libnvidia-container-tools (>= {v}), libnvidia-container-tools (<< 2.0.0)",
    "libnvidia-container-tools": "libnvidia-container1 (>= {v})",
}

RUNTIME_STANDIN = """#!/bin/sh
echo "nvidia-container-runtime: lab stand-in (sparkops drivers scenario), there is no GPU here" >&2
exit 1
"""


def arch():
    return subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True, text=True).stdout.strip()


def build(repo, name, version, architecture):
    deb = os.path.join(repo, "%s_%s_%s.deb" % (name, version.replace(":", "%3a"), architecture))
    if os.path.exists(deb):
        return deb
    with tempfile.TemporaryDirectory() as root:
        os.chmod(root, 0o755)  # the package's "./" (dpkg would give its mode to /)
        os.makedirs(os.path.join(root, "DEBIAN"))
        control = ["Package: %s" % name, "Version: %s" % version, "Architecture: %s" % architecture,
                   "Maintainer: sparkops lab <lab@sparkops.invalid>", "Section: misc", "Priority: optional"]
        if name in DEPENDS:
            control.append("Depends: " + DEPENDS[name].format(v=version))
        control.append("Description: lab stand-in for NVIDIA's %s\n sparkops drivers scenario: a package with NVIDIA's name and version, no GPU code." % name)
        with open(os.path.join(root, "DEBIAN", "control"), "w") as handle:
            handle.write("\n".join(control) + "\n")
        marker_dir = os.path.join(root, "usr", "share", "sparkops-lab", "packages")
        os.makedirs(marker_dir)
        with open(os.path.join(marker_dir, name), "w") as handle:
            handle.write(version + "\n")
        if name == "nvidia-container-toolkit-base":
            os.makedirs(os.path.join(root, "usr", "bin"))
            path = os.path.join(root, "usr", "bin", "nvidia-container-runtime")
            with open(path, "w") as handle:
                handle.write(RUNTIME_STANDIN)
            os.chmod(path, 0o755)
        subprocess.run(["dpkg-deb", "--root-owner-group", "--build", root, deb], check=True, capture_output=True)
    return deb


def index(repo):
    stanzas = []
    for deb in sorted(f for f in os.listdir(repo) if f.endswith(".deb")):
        path = os.path.join(repo, deb)
        control = subprocess.run(["dpkg-deb", "-f", path], check=True, capture_output=True, text=True).stdout.rstrip("\n")
        with open(path, "rb") as handle:
            data = handle.read()
        stanzas.append("%s\nFilename: ./%s\nSize: %d\nSHA256: %s\n" % (control, deb, len(data), hashlib.sha256(data).hexdigest()))
    packages = "\n".join(stanzas).encode()
    with open(os.path.join(repo, "Packages.tmp"), "wb") as handle:
        handle.write(packages)
    os.replace(os.path.join(repo, "Packages.tmp"), os.path.join(repo, "Packages"))
    release = "Origin: sparkops-lab\nLabel: sparkops-lab\nDate: %s\nSHA256:\n %s %d Packages\n" % (
        time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime()), hashlib.sha256(packages).hexdigest(), len(packages))
    with open(os.path.join(repo, "Release.tmp"), "w") as handle:
        handle.write(release)
    os.replace(os.path.join(repo, "Release.tmp"), os.path.join(repo, "Release"))


def main(argv):
    repo = argv[1]
    os.makedirs(repo, exist_ok=True)
    architecture = arch()
    for spec in argv[2:]:
        name, version = spec.split("=", 1)
        build(repo, name, version, architecture)
    index(repo)


if __name__ == "__main__":
    main(sys.argv)
