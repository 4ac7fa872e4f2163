# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV cache spec the image's OWN vLLM builds for a model, from its config.json alone: no
weights, no GPU memory, no network. Runs inside a throwaway container of the exact runtime image:

    docker run --rm -i --network none --entrypoint python3 IMAGE - \\
        --tp N [--max-model-len L] CONFIG_JSON [CONFIG_JSON ...] < vllm_kv_spec.py

CONFIG_JSON is the text of a checkpoint's config.json (one argument each; the serve role passes
one). For each, every tensor-parallel rank (N processes, a gloo group on 127.0.0.1) does what
vLLM's engine does before it profiles memory, and nothing more: the engine config
(``EngineArgs(load_format="dummy", dtype="bfloat16", tensor_parallel_size=N)``, KV cache dtype
auto), the model built by ``initialize_model()`` under ``torch.device("meta")``, and the spec of
every attention layer of the static forward context (``get_kv_cache_spec``), a layer that reuses
another's cache skipped. Before that, the config loses ``quantization_config`` (weight
quantisation does not change the KV cache) and ``auto_map`` (remote code the image does not
have), and a multimodal ``<X>ForConditionalGeneration`` becomes its ``text_config`` as
``<X>ForCausalLM`` (its language model holds the whole KV cache); ``dropped_from_config`` says so.

Rank 0's figures, BF16, per rank (what the memory plan counts on one node): bytes per token of a
layer = ``real_page_size_bytes / block_size``; ``full`` (full and latent attention), ``sliding``
per window, ``chunked`` per chunk, the recurrent (Mamba, GDN) state bytes of one sequence. Exit
status:

    0  measured: one JSON object on stdout, {"vllm_version", "tensor_parallel_size",
       "specs": [one per CONFIG_JSON, in order]};
    2  the arguments are wrong (a CONFIG_JSON that is not a JSON object, a bad --tp);
    3  this vLLM cannot build that model's KV cache spec (its error on stderr);
    4  vLLM cannot be loaded from this image (what failed, on stderr): the image is the problem;
    5  a rank gave no answer within --timeout seconds.
"""
import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import traceback

EXIT_BAD_ARGS = 2
EXIT_CANNOT_BUILD = 3
EXIT_CANNOT_LOAD = 4
EXIT_NO_ANSWER = 5
DROPPED_KEYS = ("quantization_config", "compression_config", "auto_map")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_folder(config, parent):
    """A folder holding the config.json vLLM reads (see the module's docstring), and what was dropped."""
    config = dict(config)
    dropped = [k for k in DROPPED_KEYS if config.pop(k, None) is not None]
    text = config.get("text_config")
    if isinstance(text, dict) and "quantization_config" in text:
        text = dict(text)
        text.pop("quantization_config")
        config["text_config"] = text
        dropped.append("text_config.quantization_config")
    archs = config.get("architectures") or []
    if len(archs) == 1 and str(archs[0]).endswith("ForConditionalGeneration") and isinstance(text, dict):
        text = dict(text)
        text["architectures"] = [archs[0].replace("ForConditionalGeneration", "ForCausalLM")]
        for key in ("dtype", "torch_dtype", "tie_word_embeddings"):
            if key in config and key not in text:
                text[key] = config[key]
        config = text
        dropped.append("multimodal wrapper: text_config as %s" % text["architectures"][0])
    folder = tempfile.mkdtemp(prefix="model-", dir=parent)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle)
    return folder, dropped


def describe(spec):
    """One layer's spec as plain JSON: its kind, span and bytes."""
    from vllm.v1 import kv_cache_interface as kci  # pylint: disable=import-outside-toplevel

    out = {"spec": type(spec).__name__}
    if isinstance(spec, kci.MambaSpec):
        out.update(kind="recurrent", state_bytes=spec.real_page_size_bytes,
                   dtypes=[str(d).replace("torch.", "") for d in spec.dtypes])
    elif isinstance(spec, kci.AttentionSpec):
        out["bytes_per_token"] = spec.real_page_size_bytes / spec.block_size
        if isinstance(spec, kci.SlidingWindowSpec):
            out.update(kind="sliding", window=spec.sliding_window)
        elif isinstance(spec, kci.ChunkedLocalAttentionSpec):
            out.update(kind="chunked", chunk=spec.attention_chunk_size)
        elif isinstance(spec, kci.FullAttentionSpec):
            out.update(kind="full")
        else:
            out.update(kind=out["spec"])
    else:
        out.update(kind=out["spec"])
    return out


def summary(layers):
    """The layers' specs by kind, as the memory plan reads them (its input kv_layout_measured)."""
    spans = {"sliding": {}, "chunked": {}}
    for layer in layers:
        if layer["kind"] in spans:
            key = layer.get("window", layer.get("chunk"))
            group = spans[layer["kind"]].setdefault(key, {"layers": 0, "bytes_per_token": 0})
            group["layers"] += 1
            group["bytes_per_token"] += layer["bytes_per_token"]
    full = [l for l in layers if l["kind"] == "full"]
    recurrent = [l for l in layers if l["kind"] == "recurrent"]
    return {
        "full_layers": len(full),
        "full_bytes_per_token": sum(l["bytes_per_token"] for l in full),
        "sliding": [dict(window=k, **v) for k, v in sorted(spans["sliding"].items())],
        "chunked": [dict(chunk=k, **v) for k, v in sorted(spans["chunked"].items())],
        "recurrent_layers": len(recurrent),
        "recurrent_kind": sorted({l["spec"] for l in recurrent})[0] if recurrent else None,
        "recurrent_state_bytes_per_sequence": sum(l["state_bytes"] for l in recurrent),
        "recurrent_dtypes": sorted({"/".join(l["dtypes"]) for l in recurrent}),
        "other": sorted({l["kind"] for l in layers} - {"full", "sliding", "chunked", "recurrent"}),
    }


def rank_main(rank, args, folders, port, queue):
    """One tensor-parallel rank: each model in turn, its spec put on the queue as (index, rank, result)."""
    os.dup2(2, 1)  # vLLM logs to stdout: the parent's stdout carries the JSON alone
    os.environ["VLLM_DIST_IDENT"] = str(port)  # the CPU worker's shared-memory groups are named after it
    try:
        import torch  # pylint: disable=import-outside-toplevel
        import vllm  # pylint: disable=import-outside-toplevel
        from vllm.config import get_layers_from_vllm_config, set_current_vllm_config  # pylint: disable=import-outside-toplevel
        from vllm.distributed import (ensure_model_parallel_initialized,  # pylint: disable=import-outside-toplevel
                                      init_distributed_environment)
        from vllm.engine.arg_utils import EngineArgs  # pylint: disable=import-outside-toplevel
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase  # pylint: disable=import-outside-toplevel
        from vllm.model_executor.model_loader.utils import initialize_model  # pylint: disable=import-outside-toplevel
    except Exception as exc:  # a broken image may fail in any way while vLLM imports
        queue.put((None, rank, {"cannot_load": "%s: %s" % (type(exc).__name__, exc)}))
        return
    for index, folder in enumerate(folders):
        try:
            engine = EngineArgs(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                                tensor_parallel_size=args.tp, enforce_eager=True, max_model_len=args.max_model_len,
                                distributed_executor_backend="mp" if args.tp > 1 else None)
            config = engine.create_engine_config()
            with set_current_vllm_config(config):
                if not torch.distributed.is_initialized():
                    init_distributed_environment(world_size=args.tp, rank=rank, local_rank=rank, backend="gloo",
                                                 distributed_init_method="tcp://127.0.0.1:%d" % port)
                ensure_model_parallel_initialized(args.tp, 1)
                with torch.device("meta"):
                    initialize_model(vllm_config=config)
                layers, shared = [], 0
                for module in get_layers_from_vllm_config(config, AttentionLayerBase).values():
                    if getattr(module, "kv_sharing_target_layer_name", None):
                        shared += 1
                        continue
                    spec = module.get_kv_cache_spec(config)
                    if spec is not None:
                        layers.append(describe(spec))
            result = summary(layers)
            result.update(shared_layers=shared, vllm_version=vllm.__version__,
                          cache_dtype=config.cache_config.cache_dtype,
                          model_dtype=str(config.model_config.dtype).replace("torch.", ""))
        except Exception as exc:  # report it, go on with the next model
            result = {"error": "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else ""),
                      "trace": traceback.format_exc()[-2000:]}
        queue.put((index, rank, result))


def measure(args, configs):
    """[rank 0's result per config], or raises SystemExit with the documented status."""
    workdir = tempfile.mkdtemp(prefix="sparkops-kv-spec-")
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(workdir, "cache"))
    folders, dropped = [], []
    for config in configs:
        folder, gone = model_folder(config, workdir)
        folders.append(folder)
        dropped.append(gone)
    ctx = multiprocessing.get_context("fork")  # the script came on stdin: a spawned child could not import it
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args, folders, port, queue)) for r in range(args.tp)]
    for proc in procs:
        proc.start()
    results = [None] * len(configs)
    try:
        for _answer in range(len(configs) * args.tp):
            index, rank, result = queue.get(timeout=args.timeout)
            if index is None:
                sys.stderr.write("vllm_kv_spec: cannot load vLLM from this image: %s\n" % result["cannot_load"])
                raise SystemExit(EXIT_CANNOT_LOAD)
            if rank == 0 and results[index] is None or "error" in result:
                results[index] = result  # rank 0's figures, unless a rank failed
    except SystemExit:
        raise
    except Exception as exc:  # queue.Empty: a rank hung
        sys.stderr.write("vllm_kv_spec: a rank gave no answer in %d s (%s)\n" % (args.timeout, type(exc).__name__))
        raise SystemExit(EXIT_NO_ANSWER)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    failed = [(i, r) for i, r in enumerate(results) if "error" in r]
    for index, result in failed:
        sys.stderr.write("%s\nvllm_kv_spec: vLLM cannot build the KV cache spec of config %d: %s\n"
                         % (result["trace"], index + 1, result["error"]))
    if failed:
        raise SystemExit(EXIT_CANNOT_BUILD)
    for result, gone in zip(results, dropped):
        result["dropped_from_config"] = gone
    return results


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="vllm_kv_spec.py", description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (ranks)")
    parser.add_argument("--max-model-len", type=int, default=None, help="vLLM --max-model-len (default: the config's)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds to wait for the next answer of a rank")
    parser.add_argument("configs", nargs="+", metavar="CONFIG_JSON", help="the text of a config.json")
    args = parser.parse_args(argv)  # argparse exits 2 with its message
    if args.tp < 1 or (args.max_model_len is not None and args.max_model_len < 1):
        parser.error("--tp and --max-model-len must be whole numbers >= 1")
    configs = []
    for i, text in enumerate(args.configs):
        try:
            config = json.loads(text)
        except ValueError as exc:
            parser.error("CONFIG_JSON %d is not JSON: %s" % (i + 1, exc))
        if not isinstance(config, dict):
            parser.error("CONFIG_JSON %d is a JSON %s, not an object" % (i + 1, type(config).__name__))
        configs.append(config)
    return args, configs


def main(argv):
    args, configs = parse_args(argv)
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1"),
                       ("DO_NOT_TRACK", "1")):
        os.environ.setdefault(key, value)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed while vLLM runs goes to stderr
    specs = measure(args, configs)
    for spec, text in zip(specs, args.configs):
        spec.update(tensor_parallel_size=args.tp, config_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())
    json.dump({"vllm_version": specs[0]["vllm_version"], "tensor_parallel_size": args.tp, "specs": specs}, out)
    out.write("\n")
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
