from node_setup.tasks import ns  # noqa: F401  (fab looks for `ns` in the root fabfile)
