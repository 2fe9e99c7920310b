"""`python -m eyas ...` (and `torchrun -m eyas ...`): the `eyas` command."""

from eyas.cli import main

main()
