"""`python -m remediation ...`: the runner's CLI without the root `autoheal` app."""

from remediation.cli import main

main()
