"""Stand-in `vllm` package trees, one per layout of the parts of vLLM that parse `vllm serve`
(where FlexibleArgumentParser, make_arg_parser, validate_parsed_serve_args and ServeSubcommand
live in each release), for tests of roles/serve/files/vllm_check_args.py. Each tree is tiny: the
options the serve role passes, vLLM's underscore/dash equivalence, and one cross-option check
of validate_parsed_serve_args (--enable-auto-tool-choice needs --tool-call-parser)."""
FLEXIBLE = '''
import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    """Accepts --max_model_len for --max-model-len, as vLLM's does."""

    def parse_args(self, args=None, namespace=None):
        fixed = []
        for arg in args:
            if arg.startswith("--"):
                key, sep, value = arg.partition("=")
                arg = key.replace("_", "-") + sep + value
            fixed.append(arg)
        return super().parse_args(fixed, namespace)
'''

ENGINE_ARGS = '''
import argparse


class AsyncEngineArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model", default="Qwen/Qwen3-0.6B")
        parser.add_argument("--served-model-name", nargs="+")
        parser.add_argument("--max-model-len", type=int)
        parser.add_argument("--max-num-seqs", type=int)
        parser.add_argument("--max-num-batched-tokens", type=int)
        parser.add_argument("--gpu-memory-utilization", type=float, default=0.92)
        parser.add_argument("--kv-cache-memory-bytes", type=int)
        parser.add_argument("--kv-cache-dtype", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"], default="auto")
        parser.add_argument("--speculative-config")
        parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
        parser.add_argument("--enforce-eager", action="store_true")
        parser.add_argument("--distributed-executor-backend", choices=["mp", "uni", "ray", "external_launcher"])
        return parser
'''


def cli_args(parser_module, model_tag):
    add_tag = '    parser.add_argument("model_tag", nargs="?")\n' if model_tag else ""
    return ('from %s import FlexibleArgumentParser  # noqa: F401\n' % parser_module
            + 'from vllm.engine.arg_utils import AsyncEngineArgs\n\n\n'
            + 'def make_arg_parser(parser):\n' + add_tag
            + '    parser.add_argument("--host")\n'
            + '    parser.add_argument("--port", type=int, default=8000)\n'
            + '    parser.add_argument("--enable-auto-tool-choice", action="store_true")\n'
            + '    parser.add_argument("--tool-call-parser")\n'
            + '    return AsyncEngineArgs.add_cli_args(parser)\n\n\n'
            + 'def validate_parsed_serve_args(args):\n'
            + '    if args.enable_auto_tool_choice and not args.tool_call_parser:\n'
            + '        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")\n')


def serve_module(parser_module, cli_module, model_tag, lazy=False):
    """vllm/entrypoints/cli/serve.py: imports at the top (0.8 to 0.32) or inside the methods
    with FlexibleArgumentParser only for type checkers (later releases)."""
    imp = "from %s import make_arg_parser, validate_parsed_serve_args" % cli_module
    if lazy:
        head = ("import argparse\nimport typing\n\nif typing.TYPE_CHECKING:\n"
                "    from %s import FlexibleArgumentParser\nelse:\n"
                "    FlexibleArgumentParser = argparse.ArgumentParser\n" % parser_module)
        inner = "        %s\n" % imp
    else:
        head = "from %s import FlexibleArgumentParser  # noqa: F401\n%s\n" % (parser_module, imp)
        inner = ""
    lines = [
        head, "",
        "class ServeSubcommand:",
        '    name = "serve"',
        "",
        "    @staticmethod",
        "    def cmd(args):",
        '        raise RuntimeError("the checker must never serve")',
        "",
        "    def validate(self, args):",
        inner + "        validate_parsed_serve_args(args)",
        "",
        "    def subparser_init(self, subparsers):",
        inner + '        p = subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]")',
    ]
    if model_tag:
        lines.append('        p.add_argument("model_tag", nargs="?")')
    lines.append("        return make_arg_parser(p)")
    return "\n".join(lines) + "\n"


def _tree(version, files):
    files = dict(files)
    files["vllm/__init__.py"] = '__version__ = "%s"\n' % version
    files.setdefault("vllm/utils/__init__.py", "")
    files["vllm/engine/__init__.py"] = ""
    files["vllm/engine/arg_utils.py"] = ENGINE_ARGS
    for path in list(files):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            files.setdefault("/".join(parts[:i]) + "/__init__.py", "")
    return files


OPENAI = "vllm.entrypoints.openai.cli_args"
LAUNCHERS = "vllm.entrypoints.launchers.cli_args"
ARGPARSE_UTILS = "vllm.utils.argparse_utils"

# name -> {relative path: source}
LAYOUTS = {
    # 0.10 to 0.11.0: FlexibleArgumentParser in vllm.utils, the serve options in openai.cli_args
    "0.10": _tree("0.10.2", {
        "vllm/utils/__init__.py": FLEXIBLE,
        "vllm/entrypoints/openai/cli_args.py": cli_args("vllm.utils", model_tag=False),
        "vllm/entrypoints/cli/serve.py": serve_module("vllm.utils", OPENAI, model_tag=True),
    }),
    # 0.11.1 to 0.31: vllm.utils split up, FlexibleArgumentParser only in vllm.utils.argparse_utils
    "0.12": _tree("0.12.0", {
        "vllm/utils/argparse_utils.py": FLEXIBLE,
        "vllm/entrypoints/openai/cli_args.py": cli_args(ARGPARSE_UTILS, model_tag=True),
        "vllm/entrypoints/cli/serve.py": serve_module(ARGPARSE_UTILS, OPENAI, model_tag=False),
    }),
    # 0.32 (the lab image): the serve options in vllm.entrypoints.launchers.cli_args
    "0.32": _tree("0.32.0", {
        "vllm/utils/argparse_utils.py": FLEXIBLE,
        "vllm/entrypoints/launchers/cli_args.py": cli_args(ARGPARSE_UTILS, model_tag=True),
        "vllm/entrypoints/cli/serve.py": serve_module(ARGPARSE_UTILS, LAUNCHERS, model_tag=False),
    }),
    # later: cli/serve.py imports lazily; FlexibleArgumentParser only under TYPE_CHECKING there
    "lazy": _tree("0.33.0.dev0", {
        "vllm/utils/argparse_utils.py": FLEXIBLE,
        "vllm/entrypoints/openai/cli_args.py": cli_args(ARGPARSE_UTILS, model_tag=True),
        "vllm/entrypoints/cli/serve.py": serve_module(ARGPARSE_UTILS, OPENAI, model_tag=False, lazy=True),
    }),
    # no vllm.entrypoints.cli.serve at all: make_arg_parser + validate_parsed_serve_args directly
    "no-cli": _tree("0.7.3", {
        "vllm/utils/__init__.py": FLEXIBLE,
        "vllm/entrypoints/openai/cli_args.py": cli_args("vllm.utils", model_tag=False),
    }),
}

# Images where the checker cannot load vLLM: it does not import, or its parser is nowhere known.
BROKEN = {
    "import-fails": {"vllm/__init__.py": 'raise ImportError("libcudart.so.12: cannot open shared object file")\n'},
    "unknown-layout": _tree("9.0.0", {"vllm/utils/__init__.py": "", "vllm/parsers/serve.py": FLEXIBLE}),
}


def write(root, files):
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root
