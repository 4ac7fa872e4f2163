"""Make `ansible_collections.sparkops.appliance` importable from a plain checkout.

`.collections/ansible_collections/sparkops/appliance` links to the repository root, so adding
`.collections` to sys.path lets unit tests import the collection's plugins by their real names,
exactly as ansible-test's units runner does.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, ".collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
