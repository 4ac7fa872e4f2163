# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""LAB ONLY vLLM platform plugin: vLLM's own CPU platform, able to run on Ray.

vLLM's CPU platform has an empty Ray device key, so `--distributed-executor-backend ray` is refused
("current platform cpu does not support ray"). This plugin, installed in the lab runtime image only
(lab/runtime/install.sh; entry point group `vllm.platform_plugins`), is that platform with the key
set, so every vLLM process, the driver and each Ray worker, sees the same platform.

The key is Ray's `GPU` resource: vLLM reads the device ids Ray hands a worker with
`ray.get_runtime_context().get_accelerator_ids()[key]`, which lists accelerator resources only, never
a custom resource (measured with Ray 2.60). A lab Ray node declares its one stand-in device with
`ray start --num-gpus 1` (Ray's documented override; a real Spark's Ray detects its GPU itself).
The production image never has this plugin; the serve command line is the same on both.

Across two nodes the CPU platform's communicator must not use shared memory. vLLM's CpuCommunicator
picks its shared-memory all-reduce whenever the ranks of a group agree on one group name, and the
name is the distributed init port (VLLM_DIST_IDENT), the same on every rank: across two lab Sparks
both TP ranks then wait forever in the shared-memory handshake (seen: both RayWorkerProc stuck in
initialize_worker after the gloo connections were up). The lab platform's communicator also asks
whether the ranks are on the same node (their VLLM_HOST_IP, else hostname), so a pair falls back to
torch.distributed (gloo over the interconnect) and one node keeps the shared memory. A GPU Spark
uses NCCL and never this communicator.
"""

import functools
import os
import socket

from vllm.platforms.cpu import CpuPlatform


@functools.lru_cache(maxsize=None)
def _communicator_cls():
    # Imported when vLLM asks for the communicator, not when the platform plugin loads (the
    # communicator module reaches back into vllm.platforms).
    import torch
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    class LabCpuCommunicator(CpuCommunicator):
        """vLLM's CPU communicator; shared memory only when every rank of the group is on this node."""

        def _all_group_ranks_share_shm_group_name(self) -> bool:
            here = os.environ.get("VLLM_HOST_IP") or socket.gethostname()
            nodes = [""] * self.world_size
            torch.distributed.all_gather_object(nodes, here, group=self.device_group)
            return len(set(nodes)) == 1 and super()._all_group_ranks_share_shm_group_name()

    return LabCpuCommunicator


def __getattr__(name):
    """`sparkops_lab_platform.LabCpuCommunicator`, as vLLM resolves the platform's communicator."""
    if name == "LabCpuCommunicator":
        return _communicator_cls()
    raise AttributeError(name)


class LabCpuRayPlatform(CpuPlatform):
    """vLLM's CPU platform; Ray schedules its workers on the node's declared GPU resource."""

    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "sparkops_lab_platform.LabCpuCommunicator"


def register() -> str:
    """Entry point for `vllm.platform_plugins`: the platform's qualified class name."""
    return "sparkops_lab_platform.LabCpuRayPlatform"
