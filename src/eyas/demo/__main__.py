"""`python -m eyas.demo CONFIG.yaml`: the demo pipeline (see eyas/demo/run.py)."""

from eyas.demo.run import main

main()
