# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait, bounded, until a Ray cluster has WANT alive nodes; print what it has as one JSON line.

Runs inside the runtime image (its own Ray), fed on stdin:

    docker exec -i RAY_CONTAINER python3 - ADDRESS WANT TIMEOUT_S < cluster-nodes.py

Exit status: 0 when WANT nodes are alive, 1 when the bound passed first (the JSON line names the
alive nodes), 2 when the head at ADDRESS cannot be reached. Used by the head's serve unit
(ExecStartPre: a restart waits for the worker instead of crash-looping), the cluster role and its
tests.
"""

import json
import sys
import time


def main(argv):
    address, want, timeout_s = argv[1], int(argv[2]), float(argv[3])
    import ray  # pylint: disable=import-outside-toplevel,import-error

    deadline = time.monotonic() + timeout_s
    try:
        ray.init(address=address, logging_level="error", log_to_driver=False)
    except Exception as exc:  # pylint: disable=broad-except
        print(json.dumps({"address": address, "want": want, "alive": 0, "error": str(exc)}))
        return 2
    try:
        while True:
            nodes = [{"ip": n["NodeManagerAddress"], "alive": bool(n["Alive"])} for n in ray.nodes()]
            alive = sorted(n["ip"] for n in nodes if n["alive"])
            if len(alive) >= want or time.monotonic() >= deadline:
                print(json.dumps({"address": address, "want": want, "alive": len(alive), "alive_ips": alive}))
                return 0 if len(alive) >= want else 1
            time.sleep(2)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
