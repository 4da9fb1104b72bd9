"""Logic of the command-line tools, one module per tool; the click commands live in hbtools.cli."""
