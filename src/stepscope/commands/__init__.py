"""The ``stepscope`` subcommands, one module each (``add_arguments(parser)`` and ``run(args)``)."""
