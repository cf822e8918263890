from node_setup.tasks import ns  # noqa: F401  (fab looks for `ns` in the root fabfile)
from node_setup.tasks.program import quiet_closed_pipe

quiet_closed_pipe()  # `fab jobs | head`: no BrokenPipeError traceback when the reader stops early
