# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's own KV cache spec of each model folder (a config.json, no weights), as a JSON table.

Runs inside the lab's CPU vLLM image, offline, with no weights and no tokenizer:

    fixtures=tests/unit/plugins/module_utils/kv_fixtures
    docker run --rm --network none --name kvspec-$$ --entrypoint /opt/vllm/bin/python \\
        -v "$PWD/$fixtures:/fixtures:ro" -v "$PWD/lab/runtime/kv_spec.py:/kv_spec.py:ro" \\
        "$(lab/runtime/tag.sh)" /kv_spec.py /fixtures --tp 1 2 > measured.json

Or, where docker is not at hand, with the same wheels in a venv on the host (the lab runtime's
wheelhouse, with the `vllm` +cpu alias distribution lab/runtime/install.sh adds):
`/path/to/venv/bin/python lab/runtime/kv_spec.py "$fixtures" --tp 1 2 --out measured.json`.

For each tensor-parallel size N, N child processes (the ranks, a gloo group on 127.0.0.1) take
every folder under the fixtures directory (one config.json each) in turn and do what vLLM's engine
does before it profiles memory, and nothing more:

- ``EngineArgs(model=<copy of the folder>, load_format="dummy", skip_tokenizer_init=True,
  dtype="bfloat16", tensor_parallel_size=N).create_engine_config()`` (the copy has its
  ``quantization_config`` removed: weight quantisation does not change the KV cache spec, and
  the CPU image cannot build NVFP4/FP8 layers; and its ``auto_map``: the remote code it names is
  not in the folder, transformers' own class is used where it has one; a multimodal
  ``<X>ForConditionalGeneration`` becomes its ``text_config`` as ``<X>ForCausalLM``: the wrapper
  needs the processor (torchvision, not in the image), the language model holds the KV cache);
- the model built by ``initialize_model()`` under ``torch.device("meta")`` (no weight memory);
- ``get_kv_cache_spec()`` as the model runner does: every ``AttentionLayerBase`` of the static
  forward context, a layer that reuses another's cache (``kv_sharing_target_layer_name``)
  skipped.

Per layer, bytes per token = ``page_size_bytes / block_size`` (attention), the unpadded
state bytes per sequence (Mamba/GDN); grouped by kind: ``full`` (full and latent attention),
``sliding`` (per window), ``chunked`` (per chunk), ``recurrent``. One JSON object on stdout:
``{fixture: {"tp1": {...}, "tp2": {...}}, "_meta": {...}}``; a fixture vLLM cannot build
records ``{"error": ...}`` instead. Then, on the host, merge it into the fixtures' table (the
figures derived by hand from vLLM's source stay for the fixtures vLLM could not build):

    python3 lab/runtime/kv_spec.py --merge "$fixtures/vllm_kv_spec.json" measured.json

The unit test tests/unit/plugins/module_utils/test_kv_fixtures.py compares the collection's
reading with that table.
"""
import argparse
import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import traceback


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model_dir(src):
    """A writable copy of the fixture's config.json without its quantization_config."""
    with open(os.path.join(src, "config.json")) as handle:
        config = json.load(handle)
    # auto_map names remote code the folder does not have: transformers' own class is used instead.
    dropped = [k for k in ("quantization_config", "compression_config", "auto_map") if config.pop(k, None) is not None]
    text = config.get("text_config")
    if isinstance(text, dict) and text.pop("quantization_config", None) is not None:
        dropped.append("text_config.quantization_config")
    archs = config.get("architectures") or []
    text = config.get("text_config")
    if len(archs) == 1 and archs[0].endswith("ForConditionalGeneration") and isinstance(text, dict):
        # The multimodal wrapper needs the model's processor (torchvision, not in the CPU image);
        # its language model is the vLLM class <X>ForCausalLM, whose layers hold the whole KV cache.
        text = dict(text)
        text["architectures"] = [archs[0].replace("ForConditionalGeneration", "ForCausalLM")]
        for key in ("dtype", "torch_dtype", "tie_word_embeddings"):
            if key in config and key not in text:
                text[key] = config[key]
        config = text
        dropped.append("multimodal wrapper: text_config as %s" % text["architectures"][0])
    dst = tempfile.mkdtemp(prefix="kvspec-")
    with open(os.path.join(dst, "config.json"), "w") as handle:
        json.dump(config, handle)
    return dst, dropped


def _describe(spec):
    """One layer's spec as plain JSON: kind, shape and bytes."""
    from vllm.v1 import kv_cache_interface as kci

    name = type(spec).__name__
    out = {"spec": name, "block_size": spec.block_size, "page_size_bytes": spec.page_size_bytes}
    if isinstance(spec, kci.MambaSpec):
        out.update(kind="recurrent", shapes=[list(s) for s in spec.shapes],
                   dtypes=[str(d).replace("torch.", "") for d in spec.dtypes],
                   state_bytes=spec.real_page_size_bytes)
        return out
    if isinstance(spec, kci.AttentionSpec):
        out.update(num_kv_heads=spec.num_kv_heads, head_size=spec.head_size,
                   head_size_v=spec.head_size_v, dtype=str(spec.dtype).replace("torch.", ""),
                   bytes_per_token=spec.real_page_size_bytes / spec.block_size)
        if isinstance(spec, kci.SlidingWindowSpec):
            out.update(kind="sliding", window=spec.sliding_window)
        elif isinstance(spec, kci.ChunkedLocalAttentionSpec):
            out.update(kind="chunked", chunk=spec.attention_chunk_size)
        elif isinstance(spec, kci.FullAttentionSpec):
            out.update(kind="full", latent=isinstance(spec, kci.MLAAttentionSpec),
                       sliding_window=getattr(spec, "sliding_window", None))
        else:
            out.update(kind=name)
        return out
    out.update(kind=name)
    return out


def _summary(layers):
    full = [l for l in layers.values() if l["kind"] == "full"]
    groups = {"sliding": {}, "chunked": {}}
    for layer in layers.values():
        if layer["kind"] in groups:
            key = layer.get("window", layer.get("chunk"))
            entry = groups[layer["kind"]].setdefault(key, {"layers": 0, "bytes_per_token": 0})
            entry["layers"] += 1
            entry["bytes_per_token"] += layer["bytes_per_token"]
    recurrent = [l for l in layers.values() if l["kind"] == "recurrent"]
    return {
        "full_layers": len(full),
        "full_bytes_per_token": sum(l["bytes_per_token"] for l in full),
        "sliding": [dict(window=k, **v) for k, v in sorted(groups["sliding"].items())],
        "chunked": [dict(chunk=k, **v) for k, v in sorted(groups["chunked"].items())],
        "recurrent_layers": len(recurrent),
        "recurrent_state_bytes_per_sequence": sum(l["state_bytes"] for l in recurrent),
        "recurrent_dtypes": sorted({"/".join(l["dtypes"]) for l in recurrent}),
        "other": sorted({l["kind"] for l in layers.values()} - {"full", "sliding", "chunked", "recurrent"}),
    }


def _rank(rank, tp, port, models, queue):
    """One TP rank: for each model folder, build the engine config and the model on the meta
    device and read the spec. One process per rank serves every model (vLLM imports once)."""
    os.dup2(2, 1)  # vLLM logs to stdout: keep the parent's stdout for the table alone
    # vLLM's CPU worker names its shared-memory TP groups after this (vllm/v1/worker/cpu_worker.py).
    os.environ["VLLM_DIST_IDENT"] = str(port)
    try:
        import torch
        from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
        from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        from vllm.model_executor.model_loader.utils import initialize_model
    except BaseException as exc:
        for name in models:
            queue.put((name, rank, {"error": "import: %s: %s" % (type(exc).__name__, exc)}))
        return
    for name, model in models.items():
        try:
            args = EngineArgs(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                              tensor_parallel_size=tp, enforce_eager=True, max_model_len=8192,
                              distributed_executor_backend="mp" if tp > 1 else None)
            vllm_config = args.create_engine_config()
            with set_current_vllm_config(vllm_config):
                if not torch.distributed.is_initialized():
                    init_distributed_environment(world_size=tp, rank=rank, local_rank=rank, backend="gloo",
                                                 distributed_init_method="tcp://127.0.0.1:%d" % port)
                ensure_model_parallel_initialized(tp, 1)
                with torch.device("meta"):
                    initialize_model(vllm_config=vllm_config)
                layers = {}
                shared = []
                for layer_name, module in get_layers_from_vllm_config(vllm_config, AttentionLayerBase).items():
                    if getattr(module, "kv_sharing_target_layer_name", None):
                        shared.append(layer_name)
                        continue
                    spec = module.get_kv_cache_spec(vllm_config)
                    if spec is not None:
                        layers[layer_name] = _describe(spec)
            result = _summary(layers)
            result.update(shared_layers=len(shared), model_dtype=str(vllm_config.model_config.dtype).replace("torch.", ""),
                          cache_dtype=vllm_config.cache_config.cache_dtype, layers=layers)
        except BaseException as exc:  # report, go on with the next model
            result = {"error": "%s: %s" % (type(exc).__name__, exc), "trace": traceback.format_exc()[-3000:]}
        queue.put((name, rank, result))


def measure(folders, tp, timeout):
    """{name: rank 0's result} for every folder at this TP size."""
    copies = {name: _model_dir(folder) for name, folder in folders.items()}
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    models = {name: copy[0] for name, copy in copies.items()}
    procs = [ctx.Process(target=_rank, args=(r, tp, port, models, queue)) for r in range(tp)]
    for proc in procs:
        proc.start()
    results = {}
    try:
        for _result in range(len(models) * tp):
            name, rank, result = queue.get(timeout=timeout)
            if (rank == 0 and "error" not in results.get(name, {})) or (rank and "error" in result):
                results[name] = result  # rank 0's figures, unless a rank failed
            print("%s tp%d rank %d: %s" % (name, tp, rank, result.get("error") or
                                           "full %s B/token" % result["full_bytes_per_token"]),
                  file=sys.stderr, flush=True)
    except Exception as exc:  # queue.Empty: a rank hung
        for name in models:
            results.setdefault(name, {"error": "no answer in %d s (%s)" % (timeout, type(exc).__name__)})
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
        for model, _dropped in copies.values():
            shutil.rmtree(model, ignore_errors=True)
    for name, (_model, dropped) in copies.items():
        if dropped and name in results:
            results[name]["dropped_from_config"] = dropped
    return results


def merge(table_path, *measured_paths):
    """On the host: measured entries (no error) replace the table's, marked "measured"; a fixture
    vLLM could not build keeps the table's entry (hand-derived) with the error beside it. Several
    measured files (one run per TP size, say) are combined first."""
    measured = {}
    for path in measured_paths:
        with open(path) as handle:
            for name, runs in json.load(handle).items():
                measured.setdefault(name, {}).update(runs)
    with open(table_path) as handle:
        table = json.load(handle)
    for name, runs in measured.items():
        if name == "_meta":
            continue
        errors = {tp: r["error"] for tp, r in runs.items() if "error" in r}
        if errors or name not in table:
            entry = table.setdefault(name, {"source": "hand-derived"})
            entry["measure_error"] = errors or "not in the table"
            continue
        entry = {"source": "measured", "dropped_from_config": runs[sorted(runs)[0]].get("dropped_from_config", [])}
        for tp, run in runs.items():
            entry[tp] = {k: v for k, v in run.items() if k not in ("trace", "dropped_from_config")}
        if "derivation" in table[name]:
            entry["hand_derivation"] = table[name]["derivation"]
        table[name] = entry
    table["_meta"] = dict(measured["_meta"], hand_derived=sorted(
        n for n, e in table.items() if n != "_meta" and e.get("source") != "measured"))
    with open(table_path, "w") as handle:
        json.dump(table, handle, indent=1, sort_keys=True)
        handle.write("\n")


def main():
    if sys.argv[1:2] == ["--merge"]:
        return merge(*sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("fixtures", help="a folder of model folders, each with a config.json")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--only", nargs="*", help="these model folders only")
    parser.add_argument("--timeout", type=int, default=600, help="seconds to wait for the next model's answer")
    parser.add_argument("--out", help="write the table here (default: stdout)")
    args = parser.parse_args()
    out = open(args.out, "w") if args.out else os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM logs to stdout: keep the table's stream for the table alone
    import torch
    import transformers
    import vllm

    table = {"_meta": {"vllm": vllm.__version__, "torch": torch.__version__,
                       "transformers": transformers.__version__, "script": "lab/runtime/kv_spec.py",
                       "measured": True}}
    names = sorted(n for n in os.listdir(args.fixtures)
                   if os.path.isfile(os.path.join(args.fixtures, n, "config.json"))
                   and (not args.only or n in args.only))
    folders = {name: os.path.join(args.fixtures, name) for name in names}
    for tp in args.tp:
        for name, result in measure(folders, tp, args.timeout).items():
            table.setdefault(name, {})["tp%d" % tp] = result
        if args.out:  # what is measured so far, should a later TP size not finish
            with open(args.out + ".partial", "w") as partial:
                json.dump(table, partial, indent=1, sort_keys=True)
    json.dump(table, out, indent=1, sort_keys=True)
    out.write("\n")
    out.close()


if __name__ == "__main__":
    main()
