# Parse a complete `vllm serve` command line with the image's OWN vLLM argument parser, without
# starting anything. Runs inside a throwaway container of the exact runtime image:
#   docker run --rm -i --network none --entrypoint python3 IMAGE - ARGS... < vllm_check_args.py
# ARGS are what follows `vllm serve` (the image's entrypoint), model first.
# Exit 0 and one JSON line on acceptance; on rejection exit non-zero with vLLM's own message
# (argparse prints it on stderr and exits 2; a failed validation exits 3 with its message).
# Written for the vLLM releases that have `vllm.entrypoints.cli.serve` (0.8 and later); older
# layouts fall back to make_arg_parser + validate_parsed_serve_args.
import json
import sys


def serve_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
    except ImportError:
        ServeSubcommand = None
    top = FlexibleArgumentParser(prog="vllm")
    subparsers = top.add_subparsers(required=True, dest="subparser")
    if ServeSubcommand is not None:
        cmd = ServeSubcommand()
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        return top, cmd.validate
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    serve = subparsers.add_parser("serve")
    serve.add_argument("model_tag", nargs="?")
    make_arg_parser(serve)
    return top, validate_parsed_serve_args


def main(argv):
    top, validate = serve_parser()
    args = top.parse_args(["serve"] + list(argv))  # argparse: message on stderr, exit 2
    try:
        validate(args)
    except Exception as exc:  # vLLM raises TypeError/ValueError with its message
        sys.stderr.write("vllm serve: error: %s\n" % exc)
        return 3
    import vllm

    print(json.dumps({"accepted": True, "vllm_version": getattr(vllm, "__version__", "unknown"),
                      "model": getattr(args, "model_tag", None) or getattr(args, "model", None),
                      "argv": list(argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
