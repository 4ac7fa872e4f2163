# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM model classes whose per-layer embedding table is read from the mmap'd packed file.

Each subclass of a stock vLLM text model (Gemma 3n, Gemma 4):
  * checks the pack against the model config and the checkpoint before anything is built
    (pack.open_checked: a mismatch stops the start with a message naming the table);
  * builds the model with a PackedPerLayerEmbedding in place of the per-layer
    VocabParallelEmbedding (the stock class is swapped in the model's module only while the
    subclass's __init__ runs), so the table is never allocated on the device;
  * skips the table's tensor when loading weights.
A lookup gathers the rows of the batch's token ids from the mapped file (page cache, file-backed)
and moves only those rows to the device. Every tensor-parallel rank maps the same file and reads
whole rows, so no collective is needed (stock vLLM shards the vocabulary and all-reduces).
"""

import contextlib
import logging
import mmap
import os
import re
import threading
import warnings

import torch
from torch import nn
from vllm.model_executor.models import gemma3n, gemma4

from . import ENV_FILE, pack

logger = logging.getLogger("vllm.sparkops_ple")
TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
PLE_PREFIX = re.compile(r"(per_layer_embed_tokens|embed_tokens_per_layer)$")
PLE_WEIGHT = "embed_tokens_per_layer"
_MAPS = {}
_MAPS_LOCK = threading.Lock()


class PackedTable:
    """One table of the pack, mapped read-only; rows are views of the page cache."""

    def __init__(self, path, table):
        rows, cols = table["shape"]
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        # Rows are read sparsely: no read-ahead of neighbouring pages.
        self.map.madvise(mmap.MADV_RANDOM)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the buffer is read-only: it stays so
            flat = torch.frombuffer(self.map, dtype=TORCH_DTYPES[table["dtype"]], count=rows * cols,
                                    offset=table["offset"])
        self.rows = flat.view(rows, cols)
        self.name = table["name"]
        self.nbytes = table["nbytes"]
        self.path = path


def mapped_table(path, table):
    """One mapping per process and table, shared by every module that looks it up."""
    key = (path, table["name"], table["offset"])
    with _MAPS_LOCK:
        if key not in _MAPS:
            _MAPS[key] = PackedTable(path, table)
        return _MAPS[key]


class PackedPerLayerEmbedding(nn.Module):
    """Stands where vLLM builds the per-layer VocabParallelEmbedding; holds no parameter."""

    def __init__(self, num_embeddings, embedding_dim, params_dtype=None, *_args, prefix="", **_kwargs):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.dtype = params_dtype or torch.get_default_dtype()
        self.prefix = prefix
        self.table = None

    def forward(self, input_ids):
        ids = input_ids.reshape(-1).to(device="cpu", dtype=torch.long)
        rows = self.table.rows.index_select(0, ids)  # only these rows are read (and copied)
        if rows.dtype != self.dtype:
            rows = rows.to(self.dtype)
        return rows.to(device=input_ids.device).reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self):
        where = "%s in %s" % (self.table.name, self.table.path) if self.table is not None else "not mapped"
        return "num_embeddings=%d, embedding_dim=%d, from the packed file: %s" % (
            self.num_embeddings, self.embedding_dim, where)


@contextlib.contextmanager
def _ple_from_pack(module, built):
    """Within the block, `module.VocabParallelEmbedding(...)` for the PLE table builds ours."""
    stock = module.VocabParallelEmbedding

    def build(num_embeddings, embedding_dim, *args, prefix="", **kwargs):
        if PLE_PREFIX.search(prefix):
            built.append(PackedPerLayerEmbedding(num_embeddings, embedding_dim, *args, prefix=prefix, **kwargs))
            return built[-1]
        return stock(num_embeddings, embedding_dim, *args, prefix=prefix, **kwargs)

    module.VocabParallelEmbedding = build
    try:
        yield
    finally:
        module.VocabParallelEmbedding = stock


def resident_bytes(model):
    """Bytes of the model's parameters and buffers (what loading puts on the device)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


class _ReportWeights:
    """Logs the resident weight bytes after loading (SPARKOPS_PLE_REPORT_WEIGHTS=1)."""

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        logger.info("sparkops-ple: resident model weights %d bytes (%s)", resident_bytes(self), type(self).__name__)
        return loaded


class _PackedPLE:
    """Mixin: the per-layer embedding table is served from the pack named by SPARKOPS_PLE_FILE."""

    _stock_module = None
    _stock_name = ""

    def __init__(self, *, vllm_config, prefix=""):
        path = os.environ.get(ENV_FILE, "")
        text = vllm_config.model_config.hf_config.get_text_config()
        ple_dim = getattr(text, "hidden_size_per_layer_input", 0) or 0
        if not ple_dim:  # a variant without PLE: nothing to serve from a pack
            raise pack.PackMismatchError("%s: %s=%s is set but this %s has no per-layer embeddings "
                                         "(hidden_size_per_layer_input is 0): set ple_enabled: false for this model"
                                         % (self._stock_name, ENV_FILE, path, self._stock_name))
        rows = getattr(text, "vocab_size_per_layer_input", text.vocab_size)
        cols = text.num_hidden_layers * ple_dim
        ckpt = vllm_config.model_config.model
        if not os.path.isdir(ckpt):
            raise pack.PackMismatchError("%s: the checkpoint %s is not a local directory, so the pack cannot be checked "
                                         "against it; serve a local checkpoint" % (path, ckpt))
        _index, table = pack.open_checked(path, ckpt, rows, cols, self._stock_name)
        self._check_graphs(vllm_config, prefix)
        built = []
        with _ple_from_pack(self._stock_module, built):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        if len(built) != 1:
            raise RuntimeError("sparkops-ple: %d per-layer embedding tables built in %s, expected 1: this vLLM "
                               "version builds its model differently; serve without the pack" % (len(built), self._stock_name))
        built[0].table = mapped_table(path, table)
        self._ple_table = built[0].table
        logger.info("sparkops-ple: %s: %s %s %s (%d bytes) is read from %s through mmap, not loaded",
                    self._stock_name, table["name"], table["dtype"], table["shape"], table["nbytes"], path)

    def _check_graphs(self, vllm_config, prefix):
        """Hook for classes whose lookup runs inside the model's forward."""

    def load_weights(self, weights):
        loaded = super().load_weights((n, w) for n, w in weights if PLE_WEIGHT not in n)
        logger.info("sparkops-ple: resident model weights %d bytes; PLE table %d bytes stays in %s (page cache)",
                    resident_bytes(self), self._ple_table.nbytes, self._ple_table.path)
        return loaded


class PackedGemma3nForCausalLM(_PackedPLE, gemma3n.Gemma3nForCausalLM):
    """Gemma 3n: vLLM's multimodal wrapper looks rows up in embed_input_ids, outside CUDA graphs."""

    _stock_module = gemma3n
    _stock_name = "Gemma3nForCausalLM"


class PackedGemma4ForCausalLM(_PackedPLE, gemma4.Gemma4ForCausalLM):
    """Gemma 4: text-only, the lookup is done here, before the compiled decoder runs."""

    _stock_module = gemma4
    _stock_name = "Gemma4ForCausalLM"

    def _check_graphs(self, vllm_config, prefix):
        # Top level (text-only): the lookup runs in forward(). A full CUDA graph would replay
        # the rows gathered at capture; piecewise graphs and eager mode run forward() each step.
        mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
        if (not prefix and not vllm_config.model_config.enforce_eager and mode is not None
                and hasattr(mode, "has_full_cudagraphs") and mode.has_full_cudagraphs()):
            raise pack.PackMismatchError(
                "Gemma4ForCausalLM with the PLE pack: full CUDA graphs (cudagraph_mode %s) would replay the "
                "per-layer rows of the capture; add --compilation-config '{\"cudagraph_mode\": \"PIECEWISE\"}' "
                "or --enforce-eager, or serve the checkpoint as Gemma4ForConditionalGeneration" % mode)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        if input_ids is not None and inputs_embeds is None and intermediate_tensors is None:
            # Same arithmetic as Gemma4Model's input_ids path, with the lookup outside its
            # compiled graph: embeddings and raw per-layer rows go in as inputs_embeds.
            inputs_embeds = self.model.embed_input_ids(input_ids)
            kwargs["per_layer_inputs"] = self.model.get_per_layer_inputs(input_ids)
            input_ids = None
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)


class ReportGemma3nForCausalLM(_ReportWeights, gemma3n.Gemma3nForCausalLM):
    """Stock Gemma 3n that logs its resident weight bytes (the comparison without the pack)."""


class ReportGemma4ForCausalLM(_ReportWeights, gemma4.Gemma4ForCausalLM):
    """Stock Gemma 4 that logs its resident weight bytes (the comparison without the pack)."""
