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
"""

from vllm.platforms.cpu import CpuPlatform


class LabCpuRayPlatform(CpuPlatform):
    """vLLM's CPU platform; Ray schedules its workers on the node's declared GPU resource."""

    ray_device_key: str = "GPU"


def register() -> str:
    """Entry point for `vllm.platform_plugins`: the platform's qualified class name."""
    return "sparkops_lab_platform.LabCpuRayPlatform"
