# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse a complete `vllm serve` command line with the image's OWN vLLM argument parser, without
starting anything. Runs inside a throwaway container of the exact runtime image:

    docker run --rm -i --network none --entrypoint python3 IMAGE - ARGS... < vllm_check_args.py

ARGS are what follows `vllm serve` (the image's entrypoint), model first. Exit status:

    0  accepted: one JSON line on stdout (vLLM's version, where its parser came from);
    2  vLLM's parser rejected the line (argparse's own message on stderr);
    3  vLLM's validation of the parsed line rejected it (its message on stderr);
    4  the checker could not load vLLM's serve parser from this image (what it tried, on
       stderr): the image is the problem, not the line.

vLLM moved its parser between releases; each place is tried in turn (newest first):
  FlexibleArgumentParser  vllm.utils.argparse_utils (0.11.1 and later), vllm.utils (up to 0.11.0)
  the serve parser        vllm.entrypoints.cli.serve.ServeSubcommand (0.8 and later: subparser_init
                          builds it, validate checks it, as `vllm serve` does); else
                          make_arg_parser + validate_parsed_serve_args from
                          vllm.entrypoints.launchers.cli_args (0.32) or vllm.entrypoints.openai.cli_args
                          (0.10 to 0.31), which add AsyncEngineArgs' options to the serve parser.
"""
import importlib
import json
import sys

EXIT_REJECTED_BY_VALIDATION = 3
EXIT_CANNOT_LOAD = 4
PARSER_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")
CLI_ARGS_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")
SERVE_MODULE = "vllm.entrypoints.cli.serve"


class CannotLoad(Exception):
    """vLLM, or the part of it that parses `vllm serve`, is not importable in this image."""


def _find(modules, names, tried):
    """The first of ``modules`` that imports and has all ``names``: (module name, [objects])."""
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # ImportError, or vLLM failing while it imports (a broken image)
            tried.append("%s: %s: %s" % (name, type(exc).__name__, exc))
            continue
        missing = [n for n in names if not hasattr(mod, n)]
        if missing:
            tried.append("%s: has no %s" % (name, ", ".join(missing)))
            continue
        return name, [getattr(mod, n) for n in names]
    return None, None


def serve_parser():
    """(top-level parser, validate(args), where it came from) as `vllm serve` builds them."""
    tried = []
    where, found = _find(PARSER_MODULES, ["FlexibleArgumentParser"], tried)
    if found is None:
        raise CannotLoad("no FlexibleArgumentParser in " + "; ".join(tried))
    top = found[0](prog="vllm")
    subparsers = top.add_subparsers(required=True, dest="subparser")
    serve_where, serve = _find([SERVE_MODULE], ["ServeSubcommand"], tried)
    if serve is not None:
        cmd = serve[0]()
        if hasattr(cmd, "subparser_init") and hasattr(cmd, "validate"):
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
            return top, cmd.validate, [where, serve_where + ".ServeSubcommand"]
        tried.append("%s.ServeSubcommand: has no subparser_init/validate" % serve_where)
    cli_where, cli = _find(CLI_ARGS_MODULES, ["make_arg_parser", "validate_parsed_serve_args"], tried)
    if cli is None:
        raise CannotLoad("no serve parser: " + "; ".join(tried))
    make_arg_parser, validate = cli
    serve_cmd = subparsers.add_parser("serve")
    serve_cmd = make_arg_parser(serve_cmd) or serve_cmd
    if not any(action.dest == "model_tag" for action in serve_cmd._actions):  # pylint: disable=protected-access
        serve_cmd.add_argument("model_tag", nargs="?")
    return top, validate, [where, cli_where + ".make_arg_parser"]


def main(argv):
    try:
        top, validate, where = serve_parser()
    except Exception as exc:  # CannotLoad, or vLLM failing while it builds its parser
        sys.stderr.write("vllm_check_args: cannot load vLLM's serve parser from this image: %s: %s\n"
                         % (type(exc).__name__, exc))
        return EXIT_CANNOT_LOAD
    try:
        args = top.parse_args(["serve"] + list(argv))  # argparse: its message on stderr, exit 2
    except SystemExit as exc:
        if exc.code in (0, None):  # --help or --version: printed, nothing to serve
            sys.stderr.write("vllm serve: error: the line asks for help or the version and serves nothing\n")
            return EXIT_REJECTED_BY_VALIDATION
        raise
    except Exception as exc:  # an option's own check raised instead of calling parser.error
        sys.stderr.write("vllm serve: error: %s: %s\n" % (type(exc).__name__, exc))
        return EXIT_REJECTED_BY_VALIDATION
    try:
        validate(args)
    except Exception as exc:  # vLLM raises TypeError/ValueError with its message
        sys.stderr.write("vllm serve: error: %s\n" % exc)
        return EXIT_REJECTED_BY_VALIDATION
    vllm = sys.modules.get("vllm")
    print(json.dumps({"accepted": True, "vllm_version": getattr(vllm, "__version__", "unknown"),
                      "parser": where,
                      "model": getattr(args, "model_tag", None) or getattr(args, "model", None),
                      "argv": list(argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
