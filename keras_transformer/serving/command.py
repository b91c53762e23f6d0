"""`keras-transformer serve`'s options, and the command itself."""


def register(add_command):
    """Adds `serve` to the command line's subcommands."""
    command = add_command("serve", help="translators behind LibreTranslate's HTTP API, batching requests together")
    add_arguments(command)
    command.set_defaults(run=run)


def add_arguments(command):
    command.add_argument("--model-dir", action="append", required=True, metavar="DIR", help="a translator directory; repeat for more pairs")
    command.add_argument("--languages", action="append", metavar="PAIR", help="the pair of each --model-dir in turn, such as en-de (default: the one saved with it)")
    command.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    command.add_argument("--port", type=int, default=5000, help="the port (default 5000)")
    command.add_argument("--beam-size", type=int, help="hypotheses kept (default: the saved one)")
    command.add_argument("--beam-sizes", type=int, nargs="+", default=[], metavar="N", help="other beam sizes /v1/translate may ask for (each compiled at start)")
    command.add_argument("--quantize", choices=["int8"], help="decode with int8 weights")
    command.add_argument("--max-source-length", type=int, metavar="TOKENS", help="the longest sentence decoded whole "
                         "(default: the saved one); longer ones go in pieces. Fewer shapes to compile at start")
    command.add_argument("--no-warm-up", action="store_true", help="start at once; compile each shape when first met")
    command.add_argument("--max-batch-tokens", type=int, default=4096, help="source tokens decoded together at most (default 4096)")
    command.add_argument("--max-wait-ms", type=float, default=50.0, help="how long a batch waits for as many sentences as the last had (default 50)")
    command.add_argument("--max-queue", type=int, default=1024, help="sentences waiting before requests get 429 (default 1024)")
    command.add_argument("--no-batching", action="store_true", help="decode each request on its own, one after another (to compare)")
    command.add_argument("--threads", type=int, help="CPU cores the backend computes on (default: all it may use)")
    command.add_argument("--max-request-bytes", type=int, default=1_000_000, help="a request's size at most (default 1000000)")
    command.add_argument("--max-texts", type=int, default=128, help="texts in one request at most (default 128)")
    command.add_argument("--max-characters", type=int, default=100_000, help="characters of one text at most (default 100000)")
    command.add_argument("--max-sentences", type=int, default=2_000, help="sentences in one request at most (default 2000)")
    command.add_argument("--timeout", type=int, default=120, help="seconds a request may take before a 503 (default 120)")


def run(args):
    from keras_transformer.data.languages import parse_pair
    from keras_transformer.serving import Limits
    from keras_transformer.serving import serve

    overrides = {name: getattr(args, name) for name in ("beam_size", "quantize", "max_source_length")
                 if getattr(args, name) is not None}
    serve(
        args.model_dir, None if args.languages is None else [parse_pair(pair) for pair in args.languages],
        host=args.host, port=args.port, warm_up=not args.no_warm_up,
        limits=Limits(request_bytes=args.max_request_bytes, texts=args.max_texts, characters=args.max_characters,
                      sentences=args.max_sentences, timeout=args.timeout),
        batching={"max_tokens": args.max_batch_tokens, "max_wait": args.max_wait_ms / 1000, "max_queue": args.max_queue,
                  "across_requests": not args.no_batching},
        beam_sizes=args.beam_sizes, threads=args.threads, **overrides,
    )
