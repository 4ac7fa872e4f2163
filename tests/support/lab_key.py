"""The lab's API key, for the scenario tests that send requests to a lab server.

The example inventory sets serve_api_key from vault_serve_api_key (its group_vars/sparks/vault.yml,
a user's to fill and encrypt); the lab, which has no such vault, sets vault_serve_api_key in its
one override file. This reads it from there, so no test carries a copy. vLLM checks the key on
/v1/* only (/health and /metrics answer without it).
"""
import os

import yaml

OVERRIDES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "inventories", "lab", "group_vars", "sparks", "lab_overrides.yml")


def api_key():
    with open(OVERRIDES) as handle:
        return yaml.safe_load(handle)["vault_serve_api_key"]


def auth_header():
    """{"Authorization": "Bearer <key>"}."""
    return {"Authorization": "Bearer %s" % api_key()}


def curl_auth():
    """The curl arguments that send the key, as one shell-quoted string."""
    return "-H 'Authorization: Bearer %s'" % api_key()


GATEWAY_OVERRIDES = os.path.join(os.path.dirname(OVERRIDES), os.pardir, "gateways", "lab_overrides.yml")


def gateway_key():
    """The key a lab client sends to the lab's gateway (its override file's vault_gateway_client_api_keys)."""
    with open(GATEWAY_OVERRIDES) as handle:
        return yaml.safe_load(handle)["vault_gateway_client_api_keys"][0]
