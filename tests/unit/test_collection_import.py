"""The checkout resolves as the sparkops.appliance collection."""
import importlib
import os


def test_collection_package_points_at_this_checkout():
    mod = importlib.import_module("ansible_collections.sparkops.appliance.plugins")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    here = os.path.realpath(os.path.join(root, "..", "plugins"))
    assert os.path.realpath(list(mod.__path__)[0]) == here
