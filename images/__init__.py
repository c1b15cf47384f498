"""Container images for autoheal, built from Debian packages into OCI layouts (no registry pull).

Sits beside the runner and the Pulumi components above the core: it imports only `autoheal`.
"""
