# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkops' vLLM plugin: per-layer embeddings (PLE) read from the packed file through mmap.

vLLM calls `register()` (entry point group `vllm.general_plugins`) in each of its processes
before it builds the model. Without SPARKOPS_PLE_FILE (set only by the serve role's unit when a
pack is mounted) it does nothing: stock vLLM. With it, the text models that hold a per-layer
embedding table are replaced, through vLLM's model registry, by subclasses that look rows up in
the mmap'd pack and never load the table as a weight (docs/ple-runtime.md).
"""

import logging
import os

__version__ = "1.0.0"
ENV_FILE = "SPARKOPS_PLE_FILE"
ENV_REPORT = "SPARKOPS_PLE_REPORT_WEIGHTS"  # "1": log the resident weight bytes (also without a pack)
ARCHITECTURES = {
    # vLLM's multimodal Gemma 3n / Gemma 4 wrappers build their language model through the
    # registry under these names, so replacing the text classes covers them too.
    "Gemma3nForCausalLM": "sparkops_vllm_ple.models:PackedGemma3nForCausalLM",
    "Gemma4ForCausalLM": "sparkops_vllm_ple.models:PackedGemma4ForCausalLM",
}
REPORT_ONLY = {
    "Gemma3nForCausalLM": "sparkops_vllm_ple.models:ReportGemma3nForCausalLM",
    "Gemma4ForCausalLM": "sparkops_vllm_ple.models:ReportGemma4ForCausalLM",
}
logger = logging.getLogger("vllm.sparkops_ple")


def register():
    """The vllm.general_plugins entry point."""
    path = os.environ.get(ENV_FILE, "")
    if path:
        table = ARCHITECTURES
    elif os.environ.get(ENV_REPORT) == "1":
        table = REPORT_ONLY
    else:
        return
    from vllm import ModelRegistry  # pylint: disable=import-outside-toplevel

    for arch, target in table.items():
        ModelRegistry.register_model(arch, target)
    if path:
        logger.info("sparkops-ple: PLE served from the packed file %s (mmap) for %s", path, ", ".join(sorted(table)))
