"""The command line: the ``probe`` / ``rm-probe`` console script and one module per subcommand. Each module
imports the library only when it runs, so that ``--help`` answers at once."""
