"""The Molecule base config carries the same lab differences as the lab inventory's override file."""
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# How the runtime image tag is found differs by construction (an env lookup with a tag.sh fallback
# in the inventory, Molecule's own ${VAR} substitution in its config).
DIFFERENT = {"runtime_image_base"}


def load(*parts):
    with open(os.path.join(ROOT, *parts)) as handle:
        return yaml.safe_load(handle)


def test_molecule_base_config_matches_the_lab_overrides():
    lab = load("inventories", "lab", "group_vars", "sparks", "lab_overrides.yml")
    molecule = load(".config", "molecule", "config.yml")["provisioner"]["inventory"]["group_vars"]["sparks"]
    assert set(lab) == set(molecule)
    assert {k: v for k, v in lab.items() if k not in DIFFERENT} == \
        {k: v for k, v in molecule.items() if k not in DIFFERENT}
