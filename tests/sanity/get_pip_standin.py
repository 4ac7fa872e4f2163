"""Stand-in for ansible-test's get-pip bootstrap script (its download host is unreachable here).

ansible-test runs the cached script as `python get_pip_X_Y.py [pip options] pip==X.Y
--no-setuptools --no-wheel` inside a fresh venv. This installs pip from the interpreter's own
ensurepip, then the requested packages from the configured package index, trusting the host's
CA bundle (a TLS-intercepting proxy sits in front of PyPI on our CI machines).
"""
import os
import subprocess
import sys

CA_BUNDLE = os.environ.get("SPARKOPS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")


def main():
    args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
    cert = ["--cert", CA_BUNDLE] if os.path.exists(CA_BUNDLE) else []
    subprocess.check_call([sys.executable, "-m", "pip", "install"] + cert + args)


if __name__ == "__main__":
    main()
