"""Make the shared test helpers kept in tests/unit itself (ansible_json) importable from its subfolders."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
