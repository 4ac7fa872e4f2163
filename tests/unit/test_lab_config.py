"""The Molecule base config and the lab inventory describe the same lab Spark."""
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Values that differ by construction: how the image tag is found, and the Spark's container name
# (the lab's ansible_host, Molecule's inventory_hostname).
DIFFERENT = {"runtime_image_base", "serve_docker_network", "serve_engine_root_container"}


def load(*parts):
    with open(os.path.join(ROOT, *parts)) as handle:
        return yaml.safe_load(handle)


def test_molecule_base_config_matches_the_lab_inventory():
    lab = load("inventories", "lab", "group_vars", "sparks.yml")
    molecule = load(".config", "molecule", "config.yml")["provisioner"]["inventory"]["group_vars"]["sparks"]
    assert set(lab) == set(molecule)
    assert {k: v for k, v in lab.items() if k not in DIFFERENT} == \
        {k: v for k, v in molecule.items() if k not in DIFFERENT}
